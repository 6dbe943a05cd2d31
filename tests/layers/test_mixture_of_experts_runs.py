"""PyTorch's grouped product of the experts' runs (`expert_runs`, a custom operation): its outputs and its
gradients (of the rows and of the three stacked weights) against PyTorch's autograd through one product per expert,
and the compiled training step's graph holding it as one node (no gathered copy of the weights).

Axes: A assignment rows sorted by expert, D model width, E experts, I one expert's width.
"""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "torch", reason="the grouped product is PyTorch's (XLA runs blocks or a switch)"
)

D, I, E = 6, 10, 5


def _reference(torch, x, counts, gate, up, down, activation):
    """The same runs through PyTorch's own autograd: one product per expert on its rows."""
    functions = {
        "silu": torch.nn.functional.silu,
        "gelu": lambda t: torch.nn.functional.gelu(t, approximate="none"),
        "gelu_approximate": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        "relu": torch.relu,
    }
    outputs, start = [], 0
    for expert, count in enumerate(counts.tolist()):
        x_e = x[start : start + count]  # (count, D)
        outputs.append((functions[activation](x_e @ gate[expert]) * (x_e @ up[expert])) @ down[expert])
        start += count
    return torch.cat(outputs)  # (A, D)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_approximate", "relu"])
@pytest.mark.parametrize("counts", [[3, 0, 4, 1, 0], [0, 0, 0, 0, 7], [2, 2, 2, 2, 2]])
def test_runs_and_gradients_match_autograd(activation, counts, rng):
    import torch

    from keras_transformer.layers.expert_runs import expert_runs

    counts = torch.tensor(counts, dtype=torch.int32)
    rows = int(counts.sum())
    tensors = [
        torch.tensor(rng.standard_normal(shape).astype("float32"), requires_grad=True)
        for shape in ((rows, D), (E, D, I), (E, D, I), (E, I, D))
    ]
    grad = torch.tensor(rng.standard_normal((rows, D)).astype("float32"))
    x, gate, up, down = tensors
    ours = expert_runs(x, counts, gate, up, down, activation)
    theirs = _reference(torch, x, counts, gate, up, down, activation)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-5)
    our_grads = torch.autograd.grad(ours, tensors, grad)
    their_grads = torch.autograd.grad(theirs, tensors, grad, allow_unused=True)
    for name, a, b in zip(("x", "gate", "up", "down"), our_grads, their_grads):
        b = torch.zeros_like(a) if b is None else b
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    unused = [e for e, count in enumerate(counts.tolist()) if count == 0]
    assert all(float(g[unused].abs().max()) == 0 for g in our_grads[1:]) if unused else True


def test_compiled_train_step_records_the_runs_as_one_node(rng):
    """The traced training step holds the runs as custom operations (forward and backward) and copies no expert's
    weights: no gather (index_select) of a stacked (E, D, I) tensor, no scatter-add into one."""
    import torch

    from keras_transformer.layers import MixtureOfExperts
    from keras_transformer.models.compiled_train_step import CompiledTrainStep

    inputs = keras.Input((4, D))
    model = keras.Model(inputs, MixtureOfExperts(E, 2, I)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")  # SGD reads its rate in Python
    x = rng.standard_normal((2, 4, D)).astype("float32")
    model.fit(x, x, epochs=1, verbose=0)  # builds the optimizer and metrics
    step = CompiledTrainStep(model)
    step._vars = step._state()
    graph = step._trace(torch.tensor(x), torch.tensor(x), None)  # what `torch.compile` is given (not compiled here)
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count("keras_transformer.expert_runs.default") == 1
    assert targets.count("keras_transformer.expert_runs_backward.default") == 1
    stacked = {(E, D, I), (E, I, D)}
    for node in graph.graph.nodes:
        if node.op == "call_function" and "index" in str(node.target):
            shapes = {tuple(a.meta["val"].shape) for a in node.all_input_nodes if "val" in a.meta}
            assert not shapes & stacked, f"{node.target} moves an expert's weights"
