"""The PyTorch training step as one compiled graph: forward, loss, backward, optimizer update, metrics;
and the evaluation (forward, loss, metrics) and prediction (forward) steps the same way.

Keras's own `jit_compile=True` on PyTorch hands `train_step` to Dynamo, which then traces Keras's
Python (layer `__call__`, name scopes, dtype policies, the optimizer's bookkeeping): it breaks the
step into dozens of graphs and recompiles frames such as `Layer.__setattr__` and `Functional.call`
once per distinct argument until Dynamo's cache limit. This module traces the step below Python
instead: `make_fx` runs the step once on fake tensors, with every variable (model, optimizer,
metrics) mapped to an input through a `keras.StatelessScope`, and records the ATen operations,
backward included. The recorded graph has no Python left in it, so `torch.compile` takes it whole
(`fullgraph=True`, static shapes). Variables are updated in place by the graph.

Reads of constant tensors in Python (a slice start of 0) are folded into the graph; dropout draws
from torch's global generator inside the graph. A step whose Python reads a value computed from
the variables or the batch (a data-dependent branch, e.g. a loss-scale or gradient-accumulation
`ops.cond`) cannot be traced this way; such a model trains eagerly, and says so once.

`Task.compile` installs the three steps as Keras's `train_function`, `test_function` and
`predict_function` (`jit_compile=False` keeps Keras's eager ones); each compiles on its own, after
its own eager warm-up under `jit_compile="auto"`.
"""

import logging
import os
import time
from unittest import mock

import keras

_log = logging.getLogger("keras_transformer")

# Distinct input signatures (batch shapes, dtypes) compiled per model before new ones run eagerly.
MAX_SIGNATURES = 4

# `jit_compile="auto"` compiles once a model has spent this long in eager steps: compiling costs tens of
# seconds, which a short run (a test, a notebook cell on a tiny model) never earns back.
COMPILE_AFTER_SECONDS = 10.0


class CompiledStep:
    """Base of the compiled steps (`CompiledTrainStep`, `CompiledTestStep`, `CompiledPredictStep`, one file each):
    one compiled graph per input signature for one of Keras's step functions.

    Args:
        model: a compiled `keras.Model` on the PyTorch backend.
        warmup_seconds: float, eager time in this function (first step excluded) before it compiles;
            0 compiles at the first step.

    Call arguments:
        data: the list of one batch `(x, y, sample_weight)` (or `(x,)`) that Keras's loop passes.

    Attributes:
        compiled_steps: how many steps ran through a compiled graph (tests assert on it).
        eager_steps: how many ran through Keras's eager step (warm-up or fallback).
        graphs: the traced `torch.fx.GraphModule` per input signature.
    """

    kind = None  # the words the compile log uses: "training step", "evaluation step", "prediction step"

    def __init__(self, model, warmup_seconds=0.0):
        if not warmup_seconds >= 0:
            raise ValueError(f"`warmup_seconds` must be >= 0. Received: warmup_seconds={warmup_seconds!r}")
        self.model = model
        self.warmup_seconds = warmup_seconds
        self.eager_steps = 0
        self._eager_seconds = 0.0
        self.compiled_steps = 0
        self.graphs = {}
        self._compiled = {}
        self._eager_reason = None

    # --- what a subclass says ---------------------------------------------------

    def _state(self):
        """The variables the step reads or writes, and how many of them (first) need gradients."""
        raise NotImplementedError

    def _step(self, values, x, y, sample_weight):
        """The step on `values` (one tensor per variable of `_state`); writes new values into them."""
        raise NotImplementedError

    def _eager_step(self, batch):
        raise NotImplementedError

    # --- the step, traced ---------------------------------------------------

    def _variables(self, groups):
        seen, out = set(), []
        for v in (v for group in groups for v in group):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    def _trace(self, x, y, sample_weight):
        """The step as a graph of ATen operations, recorded on fake tensors (nothing runs).

        Python that reads a tensor's value (`.item()`, `bool(tensor)`) is recorded as an unknown
        number. For a tensor made of constants (a slice start of 0) the number is computed here and
        written into the graph; a read of a value computed from an input (a variable, the batch: a
        data-dependent branch) raises, and that model runs eagerly.
        """
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx

        from keras.src.backend.torch import random as torch_random

        values = [v.value.detach().clone().requires_grad_(i < self._vars[1]) for i, v in enumerate(self._vars[0])]
        # Keras seeds a torch.Generator from its SeedGenerator's state in Python (a value read); in the
        # graph, dropout draws from torch's global generator instead, which the compiled graph advances
        # at every call (`keras.utils.set_random_seed` seeds it): a new mask per step, as in eager.
        # A tensor the layers hold outside any variable (a sinusoidal position table) is real, not fake:
        # it is recorded as a constant of the graph. A variable's value must not be (the graph would keep
        # its value at trace time), so one that `_state` missed refuses the trace.
        with mock.patch.object(torch_random, "torch_seed_generator", lambda seed: None):
            graph = make_fx(lambda *args: self._step(*args), tracing_mode="fake", _allow_non_fake_inputs=True)(
                values, x, y, sample_weight
            )
        for node in graph.graph.nodes:
            if node.op == "get_attr" and isinstance(getattr(graph, node.target), torch.nn.Parameter):
                raise ValueError(
                    f"the step reads a variable that is not the model's, its optimizer's or its "
                    f"metrics' ({node.target}, shape {tuple(getattr(graph, node.target).shape)})"
                )
        reads = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}
        for node in list(graph.graph.nodes):  # topological order: a number's users come after it
            if node.target in reads:
                value = _constant_value(graph, node)
            elif (
                node.op == "call_function"
                and not node.all_input_nodes
                and not isinstance(node.meta.get("val"), torch.Tensor)
            ):
                value = node.target(*node.args, **node.kwargs)  # arithmetic on numbers made constant above
            else:
                continue
            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=node, v=value: v if a is n else a)
            graph.graph.erase_node(node)
        graph.graph.eliminate_dead_code()
        graph.recompile()
        return graph

    # --- Keras's step function ------------------------------------------------

    def __call__(self, data):
        import torch

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data[0])
        x, y, sample_weight = keras.tree.map_structure(
            lambda t: t if t is None else keras.ops.convert_to_tensor(t), (x, y, sample_weight)
        )
        key = _signature((x, y, sample_weight))
        step = self._compiled.get(key)
        if step is None and self._eager_seconds >= self.warmup_seconds:
            step = self._build(key, x, y, sample_weight)
        if step is None:
            start = time.perf_counter()
            outputs = self._eager_step(data[0])
            if self.eager_steps > 0:  # the first step builds the optimizer and metrics
                self._eager_seconds += time.perf_counter() - start
            self.eager_steps += 1
            return outputs
        with torch.no_grad():
            outputs = step([v.value for v in self._vars[0]], x, y, sample_weight)
        self.compiled_steps += 1
        return outputs

    def _build(self, key, x, y, sample_weight):
        model = self.model
        if self._eager_reason is None and len(self._compiled) >= MAX_SIGNATURES:
            self._eager_reason = f"more than {MAX_SIGNATURES} batch shapes (pad batches to a few fixed shapes)"
        if self._eager_reason is not None:
            return None
        self._vars = self._state()
        try:
            graph = self._trace(x, y, sample_weight)
        except Exception as error:  # noqa: BLE001 - any untraceable Python falls back to Keras's eager step
            self._eager_reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            _log.warning(
                "keras_transformer: %s's %s runs eagerly on PyTorch; it cannot be compiled as one graph (%s)",
                type(model).__name__,
                self.kind,
                self._eager_reason,
            )
            return None
        if not self._compiled:
            _log.warning(
                "keras_transformer: compiling %s's %s with torch.compile (one graph; "
                "`compile(jit_compile=False)` runs eagerly)",
                type(model).__name__,
                self.kind,
            )
        import torch

        # The same switch as the decoding loop's (decoding/compile.py), e.g. "aot_eager" to debug.
        backend = os.environ.get("KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND", "inductor")
        self.graphs[key] = graph
        self._compiled[key] = torch.compile(graph, fullgraph=True, dynamic=False, backend=backend)
        return self._compiled[key]


def write(values, new_values):
    """Copy each new value into its input tensor (the graph updates the variables in place)."""
    import torch

    with torch.no_grad():
        for old, new in zip(values, new_values):
            if new is not old:
                old.copy_(new)


def _signature(tree):
    """What one compiled graph is specialised to: the batch's structure, shapes, dtypes and device."""
    return str(
        keras.tree.map_structure(lambda t: None if t is None else (tuple(t.shape), str(t.dtype), str(t.device)), tree)
    )


def _constant_value(graph, node):
    """The Python number `node` reads, computed from the graph's constants; ValueError if it needs an input."""
    import torch

    needed, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in needed:
            continue
        if current.op == "placeholder":
            raise ValueError(
                f"the step reads the value of a tensor computed from input {current.name!r} in "
                f"Python (a data-dependent branch or `.item()`)"
            )
        needed.add(current)
        stack.extend(current.all_input_nodes)
    env = {}
    for current in graph.graph.nodes:  # topological order
        if current not in needed:
            continue
        if current.op == "get_attr":
            env[current] = getattr(graph, current.target)
        elif current.op == "call_function":
            args = torch.fx.node.map_arg(current.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(current.kwargs, env.__getitem__)
            env[current] = current.target(*args, **kwargs)
        else:
            raise ValueError(f"cannot compute the constant {node.name!r} from {current.op} {current.name!r}")
    return env[node]
