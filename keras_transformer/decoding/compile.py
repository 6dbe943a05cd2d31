"""The decoding core's one backend switch: how a step or a loop is compiled for this backend and device.

This is the only module of the decoding engine that asks which backend runs (the few loop operations whose
fast form differs by backend are kernels, in kernels/loop_ops.py). It decides:
- how the loop runs (`plan`, which completes a `DecodeOptions`): XLA's compiled loop on JAX
  (`jax.jit`, model variables passed as state through a `keras.StatelessScope`) and TensorFlow
  (`tf.function(jit_compile=True)`); on PyTorch, steps through the layer-type kernels of
  `torch_kernels.py`, run eagerly or compiled with `torch.compile` (`torch_step_mode`);
- how one function of tensors is compiled (`compiled`), cached per task and key.

PyTorch's compiled step is one graph (`fullgraph=True`) per (batch, cache width), static shapes, the
cache written in place and no host synchronisation inside a step; on CUDA it is captured as a CUDA
graph and replayed (`mode="reduce-overhead"`). A decoder-only model's prefill is compiled the same way,
one graph per input shape. The kernels are kept per task and length across calls (`_torch_kernels`), so
later calls reuse the graphs. Compiled functions and kernels live in one `CompiledCache` per task.
Compiling pays on a GPU, where an eager step is one
launch per operation; on a CPU it costs seconds per bucket for a fraction of a millisecond per step
(benchmarks/RESULTS.md, "The compiled step on this CPU"), so the default there stays eager.
`KERAS_TRANSFORMER_TORCH_COMPILE=1` (or `0`) forces the choice, and
`KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND` names another `torch.compile` backend (default "inductor"; the
tests use "eager", which captures the one graph and runs it op by op, generating no code).
"""

import logging
import os
import types

import keras

from keras_transformer.decoding import cache_schedule

if keras.config.backend() == "torch":
    # The PyTorch kernels import torch, an optional dependency: loaded where Keras runs on PyTorch (and has
    # loaded torch already), never on JAX or TensorFlow.
    from keras_transformer.kernels import torch_kernels
else:
    torch_kernels = None

TORCH_COMPILE_ENV = "KERAS_TRANSFORMER_TORCH_COMPILE"
TORCH_COMPILE_BACKEND_ENV = "KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND"
TORCH_COMPILE_MODE_ENV = "KERAS_TRANSFORMER_TORCH_COMPILE_MODE"
_log = logging.getLogger("keras_transformer")


def _backend():
    return keras.config.backend()


def torch_step_mode(task):
    """ "compiled" (`torch.compile` of every step) or "eager", for a PyTorch task on its device.

    Default: compiled on CUDA, eager elsewhere; the environment variable `KERAS_TRANSFORMER_TORCH_COMPILE`
    set to 1 / 0 forces compiled / eager.
    """
    forced = os.environ.get(TORCH_COMPILE_ENV, "auto").strip().lower()
    if forced not in ("auto", "1", "0", "true", "false"):
        raise ValueError(f"`{TORCH_COMPILE_ENV}` must be auto, 1 or 0. Received: {TORCH_COMPILE_ENV}={forced!r}")
    if forced != "auto":
        return "compiled" if forced in ("1", "true") else "eager"
    import torch

    if not torch.cuda.is_available():  # checked first: the model's device is read only where CUDA exists
        return "eager"
    variables = getattr(task, "variables", ())
    return "compiled" if variables and variables[0].value.device.type == "cuda" else "eager"


class Plan:
    """How one `decode` call runs: the complete options, the layer kernels (PyTorch) and whether the
    steps are compiled one by one (PyTorch) instead of as one loop (XLA)."""

    def __init__(self, options, kernels=None, stepwise=False):
        self.options = options
        self.kernels = kernels
        self.stepwise = stepwise


def plan(task, sampler, options, shape, cache_bytes):
    """Complete `options` for this backend and a call's shape; returns a `Plan`.

    shape: (R, L), the decoded rows and the token buffer's length. cache_bytes: the size of the full (R, L)
    cache.
    """
    backend = _backend()
    rows, length = shape
    if backend == "torch":
        supported = torch_kernels.supports(task)
        compiled = supported and torch_step_mode(task) == "compiled"
        kernels = _torch_kernels(task, length if compiled else None) if supported else None
        # PyTorch's steps read (R, Hkv, S, Dh) caches: beams reorder their rows (in place, eagerly).
        options = options.replace(
            beam_cache=False,
            padded_step=False,
            chunked_cache=True,
            flat_cache=False,
            eager_rows=not compiled,
            gather_columns=True,
        )
        return Plan(options, kernels, stepwise=compiled)
    # XLA on CPU rewrites every product of a one-token, one-row step into a vector x matrix dot at half
    # the speed of a two-row product on TensorFlow: a one-row loop there pads each step's token to two.
    padded_step = backend == "tensorflow" and not sampler.reorders_rows and rows == 1
    # TensorFlow's XLA keeps a copy of the cache per width: a large cache grows through two widths only.
    chunked = backend != "tensorflow" or cache_bytes <= cache_schedule.TENSORFLOW_CHUNKED_CACHE_BYTES
    options = options.replace(
        beam_cache=sampler.num_beams > 1,
        padded_step=padded_step,
        chunked_cache=chunked,
        flat_cache=True,
        eager_rows=False,
        gather_columns=False,
    )
    return Plan(options)


def _torch_kernels(task, length):
    """The task's `TorchKernels` for static length `length` (None: eager steps), kept across calls; their
    arranged weights are refreshed when a variable was written since the last call (training, `assign`,
    loading weights: every in-place write bumps the tensor's version counter)."""
    variables = task.variables  # walks every layer: read once per call
    version = sum(variable.value._version for variable in variables)
    made = compiled_cache(task, variables).kernels  # emptied where the variables are other objects
    kernels, seen = made.get(length, (None, None))
    if kernels is None:
        kernels = torch_kernels.TorchKernels(length=length)
    elif seen != version:
        kernels.refresh()
    made[length] = (kernels, version)
    return kernels


class _Compiled:
    """A function of tensors compiled for the current backend; counts its traces."""

    def __init__(self, task, fn, step=False, other_models=()):
        self.traces = 0

        def traced(*args):
            self.traces += 1
            return fn(*args)

        backend = _backend()
        if backend == "jax":
            import jax

            variables = [
                v
                for model in (task, *other_models)
                for v in [*model.trainable_variables, *model.non_trainable_variables]
            ]

            @jax.jit
            def stateless(values, *args):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return traced(*args)

            self._call = lambda *args: stateless([v.value for v in variables], *args)
        elif backend == "tensorflow":
            import tensorflow as tf

            self._call = tf.function(traced, jit_compile=True, autograph=False, reduce_retracing=False)
        elif backend == "torch" and step:
            self._call = _torch_compiled_step(traced, fn)
        elif backend == "torch":
            import torch

            def eager(*args):
                with torch.no_grad():
                    return traced(*args)

            self._call = eager
        else:
            self._call = traced

    def __call__(self, *args):
        return self._call(*args)


def _torch_compiled_step(traced, fn):
    """`fn` under `torch.compile`: one graph, static shapes; a CUDA graph replayed on CUDA. The first call
    runs eagerly (through `traced`, which counts it): it arranges the kernels' weights and tables, which
    every compiled call then reads."""
    import torch

    from torch.utils import _pytree as pytree

    def leaves(*args):
        return pytree.tree_leaves(fn(*args))

    # Dynamo keeps compiled graphs, and its recompilation limit, per code object: every compiled step
    # gets a code object of its own, so that buckets and models never evict one another.
    leaves = types.FunctionType(
        leaves.__code__.replace(), leaves.__globals__, leaves.__name__, leaves.__defaults__, leaves.__closure__
    )

    calls = {"n": 0}
    compiled = None
    structure = None  # the outputs' tree (named tuples holding `ABSENT` empty tuples), from the eager call

    def call(*args):
        nonlocal compiled, structure
        calls["n"] += 1
        with torch.no_grad():
            if calls["n"] == 1:
                outputs = traced(*args)
                structure = pytree.tree_structure(outputs)
                return outputs
            if compiled is None:
                on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in pytree.tree_leaves(args))
                backend = os.environ.get(TORCH_COMPILE_BACKEND_ENV, "inductor")
                mode = "reduce-overhead" if on_cuda and backend == "inductor" else None
                mode = os.environ.get(TORCH_COMPILE_MODE_ENV, mode)  # e.g. max-autotune-no-cudagraphs, to compare
                _log.info(
                    "keras_transformer: compiling the decoding step with torch.compile (backend=%s, mode=%s)",
                    backend,
                    mode,
                )
                compiled = torch.compile(leaves, fullgraph=True, dynamic=False, backend=backend, mode=mode)
            # The compiled graph returns the tensors alone, rebuilt here into the loop state: on CUDA with
            # torch 2.11 the named tuples a compiled step returned came back malformed (RESULTS, "GPU").
            return pytree.tree_unflatten(compiled(*args), structure)

    return call


def compiled(task, key, build, step=False, other_models=()):
    """The compiled function `build()` for `task` under `key`, made once.

    A compiled function holds the task's variables: when they change (LoRA enabled or merged, weights
    quantized), every function is made anew, once. step=True: a PyTorch decoding step, compiled by
    `torch.compile` (see `plan`). other_models: models whose variables the function reads too (a draft model):
    on JAX they are passed in as state, as the task's are (a draft's changed weights are read at the next call).
    """
    functions = compiled_cache(task).functions
    if key not in functions:
        functions[key] = _Compiled(task, build(), step=step, other_models=other_models)
    return functions[key]


class CompiledCache:
    """A task's compiled decoding functions by key, and its PyTorch kernels by length, made for one set of
    variables (`variable_ids`): when the task's variables are other objects (LoRA enabled or merged, weights
    quantized), both are made anew."""

    def __init__(self, variable_ids=()):
        self.variable_ids = variable_ids
        self.functions = {}  # key -> `_Compiled`
        self.kernels = {}  # length (None: eager steps) -> (`TorchKernels`, the variables' version sum)


def compiled_cache(task, variables=None):
    """The task's `CompiledCache`, one attribute of the task (a plain object, which Keras does not track);
    made anew when its variables are other objects."""
    variable_ids = tuple(map(id, getattr(task, "variables", ()) if variables is None else variables))
    cache = task.__dict__.get("_compiled_decoding")
    if cache is None or cache.variable_ids != variable_ids:
        cache = CompiledCache(variable_ids)
        task._compiled_decoding = cache
    return cache


def device_inputs(tree, reused=False):
    """A call's numpy inputs as its compiled functions take them. JAX's `jit` takes numpy arrays in its own
    dispatch, faster than converting each first (an eager operation each: benchmarks/RESULTS.md, "the loop's inputs
    as numpy on JAX"); inputs `reused` by every step of a host loop are converted once, not at every step. The other
    backends take tensors."""
    if _backend() == "jax" and not reused:
        return tree
    return keras.tree.map_structure(keras.ops.convert_to_tensor, tree)


def to_numpy(outputs):
    return {k: keras.ops.convert_to_numpy(v) for k, v in outputs.items()}


__all__ = [
    "CompiledCache",
    "Plan",
    "TORCH_COMPILE_BACKEND_ENV",
    "TORCH_COMPILE_ENV",
    "compiled",
    "compiled_cache",
    "device_inputs",
    "plan",
    "torch_step_mode",
]
