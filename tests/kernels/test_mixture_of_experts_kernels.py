"""The mixture-of-experts kernels (PyTorch's and ONNX's) on every path they take, against the Keras layer.

The kernel-table test (test_kernel_table.py) holds one decoding step of a few rows; here the token counts reach
each path: per-assignment gathers (A <= E), PyTorch's eager per-expert runs and its compiled step's blocks, ONNX's
prefill blocks (b > 1 rows once A >= 8E). And only the chosen experts are read: the experts no token chose are
NaN, which any dense all-expert product (masked afterwards or not) would carry into the output.

Axes: B batch, T tokens per row, D model width, E experts, k experts per token, A = B T k assignments.
"""

import types

import keras
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from keras_transformer.export.decode_graph import OPSET_IMPORTS, _Builder
from keras_transformer.kernels import onnx_kernels
from keras_transformer.kernels.onnx_values import Value
from keras_transformer.layers import MixtureOfExperts
from tests.conftest import to_numpy

ON_TORCH = keras.config.backend() == "torch"
D = 16
# (B, T, E, k): a batch-1 step (k experts read), a few rows, and prompts whose assignments fill blocks of b > 1 rows.
SHAPES = [(1, 1, 16, 2), (3, 1, 4, 2), (2, 7, 4, 2), (3, 40, 4, 2), (2, 33, 8, 3)]


def _layer(experts, k, **kwargs):
    layer = MixtureOfExperts(num_experts=experts, top_k=k, intermediate_dim=12, **kwargs)
    layer.build((None, None, D))
    rng = np.random.default_rng(4)
    for variable in layer.weights:
        variable.assign(rng.normal(0.0, 0.4, variable.shape).astype("float32"))
    return layer


def _inputs(batch, length):
    return np.random.default_rng(5).normal(size=(batch, length, D)).astype("float32")


def _unchosen_experts_nan(layer, x):
    """The experts no token of x chose get NaN weights (a copy's: the Keras layer keeps its own); their ids."""
    _, _, experts = layer.route(keras.ops.convert_to_tensor(x.reshape(-1, D)))
    unchosen = sorted(set(range(layer.num_experts)) - set(to_numpy(experts).ravel().tolist()))
    poisoned = {}
    for name in ("gate_kernel", "up_kernel", "down_kernel"):
        values = to_numpy(getattr(layer, name)).copy()
        values[unchosen] = np.nan
        poisoned[name] = values
    return unchosen, poisoned


def _onnx(layer, x, prefill):
    builder = _Builder()
    kernels = types.SimpleNamespace(builder=builder, prefill=prefill)  # what the mixture-of-experts kernel reads
    y = onnx_kernels._mixture_of_experts(kernels, layer, Value(builder, "x")).materialize()
    output = builder.node("Identity", [y])
    graph = helper.make_graph(
        builder.nodes,
        "moe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", D])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        builder.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSET_IMPORTS], ir_version=8)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([output], {"x": x})[0], builder


@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_onnx_matches_keras_and_reads_only_chosen_experts(shape, prefill):
    batch, length, experts, k = shape
    layer = _layer(experts, k, normalize_top_k=experts != 8)
    x = _inputs(batch, length)
    expected = to_numpy(layer(x))
    got, builder = _onnx(layer, x, prefill)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
    # The stacked weights reach the products only through Gathers.
    stacked = {name for name in (init.name for init in builder.initializers) if name.endswith((".gate_up", ".down"))}
    readers = {node.op_type for node in builder.nodes for name in node.input if name in stacked}
    assert len(stacked) == 2 and readers == {"Gather"}
    unchosen, poisoned = _unchosen_experts_nan(layer, x)
    if unchosen:
        original = [to_numpy(v) for v in (layer.gate_kernel, layer.up_kernel, layer.down_kernel)]
        for name, values in poisoned.items():
            getattr(layer, name).assign(values)
        got, _ = _onnx(layer, x, prefill)
        for variable, values in zip((layer.gate_kernel, layer.up_kernel, layer.down_kernel), original):
            variable.assign(values)
        np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
    else:
        assert batch * length * k >= experts  # every expert chosen: nothing to poison


@pytest.mark.skipif(not ON_TORCH, reason="PyTorch's kernels run on the PyTorch backend only")
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_torch_matches_keras_and_reads_only_chosen_experts(shape, static):
    import torch

    from keras_transformer.kernels import torch_experts, torch_kernels

    batch, length, experts, k = shape
    layer = _layer(experts, k, normalize_top_k=experts != 8, shared_intermediate_dim=8, shared_expert_gate=True)
    x = _inputs(batch, length)
    expected = to_numpy(layer(x))
    kernels = torch_kernels.TorchKernels(length=8 if static else None)
    with torch.no_grad():
        got = kernels(layer, torch.as_tensor(x))
        assert not kernels.through_keras
        np.testing.assert_allclose(to_numpy(got), expected, atol=2e-5, rtol=1e-5)
        unchosen, poisoned = _unchosen_experts_nan(layer, x)
        if unchosen:  # the same tensors, poisoned in place (the kernels read their arranged copies)
            _, gate_up, down = kernels.weights(layer, torch_experts._arrange_mixture_of_experts)[:3]
            inner = down.shape[1]
            gate_up[..., :inner] = torch.as_tensor(poisoned["gate_kernel"])
            gate_up[..., inner:] = torch.as_tensor(poisoned["up_kernel"])
            down.copy_(torch.as_tensor(poisoned["down_kernel"]))
            np.testing.assert_allclose(to_numpy(kernels(layer, torch.as_tensor(x))), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not ON_TORCH, reason="PyTorch's kernels run on the PyTorch backend only")
def test_torch_compiled_blocks_are_one_graph():
    """The static path under `torch.compile(fullgraph=True)` (Dynamo's graph run op by op, as
    tests/decoding/test_torch_compiled.py does): no graph break (a host read or a data-dependent shape would be
    one), the same numbers as Keras."""
    import torch
    import torch._dynamo

    from keras_transformer.kernels import torch_kernels

    layer = _layer(4, 2)
    kernels = torch_kernels.TorchKernels(length=8)
    with torch.no_grad():
        kernels(layer, torch.as_tensor(_inputs(1, 1)))  # arranges the weights, as the compiled loop's first call
    for batch, length in ((1, 1), (3, 1), (3, 40)):  # per-assignment gathers, then blocks of 1 and of 15 rows
        x = _inputs(batch, length)
        torch._dynamo.reset()
        step = torch.compile(lambda x: kernels(layer, x), fullgraph=True, dynamic=False, backend="eager")
        with torch.no_grad():
            got = step(torch.as_tensor(x))
        np.testing.assert_allclose(to_numpy(got), to_numpy(layer(x)), atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not ON_TORCH, reason="PyTorch's kernels run on the PyTorch backend only")
def test_torch_hands_back_what_it_does_not_cover(monkeypatch):
    """Router logits and training go through Keras, as do experts whose weights are not float."""
    import torch

    from keras_transformer.kernels import torch_experts, torch_kernels

    layer = _layer(4, 2)
    x = torch.as_tensor(_inputs(1, 3))
    kernels = torch_kernels.TorchKernels()
    outputs, logits = kernels(layer, x, return_router_logits=True)
    assert kernels.through_keras == {"MixtureOfExperts"} and tuple(logits.shape) == (3, 4)
    assert torch_kernels._mixture_of_experts(kernels, layer, x, training=True) is NotImplemented
    # A quantization of the layer itself (its stacked experts: neither Keras's Dense nor EinsumDense) is Keras's.
    monkeypatch.setattr(torch_experts, "quantization", lambda layer: "int8")
    assert torch_experts._arrange_mixture_of_experts(layer) is None
    assert torch_kernels._mixture_of_experts(torch_kernels.TorchKernels(), layer, x) is NotImplemented


def test_onnx_quantized_graph_keeps_float_experts_and_says_so(caplog):
    """A quantized graph quantizes the router (MatMulInteger) and keeps the stacked experts float32, logged once."""
    layer = _layer(4, 2)
    builder, memo = _Builder(quantize="int8"), {}

    def remember(key, make):  # OnnxKernels.memo
        return memo[key] if key in memo else memo.setdefault(key, make())

    kernels = types.SimpleNamespace(builder=builder, prefill=False, memo=remember)
    with caplog.at_level("WARNING", logger="keras_transformer"):
        for _ in range(2):  # two layers of one graph
            onnx_kernels._mixture_of_experts(kernels, layer, Value(builder, "x"))
    assert [record.getMessage().count("stored in float32") for record in caplog.records] == [1]
    stacked = [init for init in builder.initializers if init.name.endswith((".gate_up", ".down"))]
    assert len(stacked) == 4 and all(init.data_type == TensorProto.FLOAT for init in stacked)
    assert "MatMulInteger" in {node.op_type for node in builder.nodes}
