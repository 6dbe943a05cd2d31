"""The one kernel table (kernels/kernel_table.py) and the runtimes that run decoding steps without Keras:
PyTorch's kernels and the ONNX graph builder. Generated from the table: every runtime has a kernel for every
layer type, and every kernel gives its Keras layer's numbers (one step: B rows, one new token at `POSITION`).

The whole-step tests (tests/kernels/test_torch_kernels.py, tests/export/test_decode_kernels.py) hold every
family's step to Keras; this one holds each layer type alone, so a new table entry without a case fails here.
"""

from typing import Callable, NamedTuple

import keras
import numpy as np
import onnxruntime
import pytest
from keras import ops
from onnx import TensorProto, helper

from keras_transformer.export.decode_graph import OPSET_IMPORTS, OnnxKernels, _Builder
from keras_transformer.kernels import kernel_table, onnx_kernels, torch_kernels
from keras_transformer.kernels.onnx_values import Value
from keras_transformer.layers import (
    FeedForward,
    MixtureOfExperts,
    PositionalEmbedding,
    RelativePositionBias,
    TransformerDecoderBlock,
)
from keras_transformer.layers.rms_normalization import RMSNormalization

RUNTIMES = {"torch": torch_kernels._KERNELS, "onnx": onnx_kernels.KERNELS}
ON_TORCH = keras.config.backend() == "torch"
B, D, POSITION = 2, 32, 5  # rows, model width, the new token's position (POSITION earlier positions cached)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("layer_type", list(kernel_table.KERNEL_NAMES), ids=lambda t: t.__name__)
def test_runtime_has_the_tables_kernel(runtime, layer_type):
    kernel = RUNTIMES[runtime][layer_type]
    assert kernel.__name__.removeprefix("_") == kernel_table.KERNEL_NAMES[layer_type]  # (a module of its own: public)
    assert set(RUNTIMES[runtime]) == set(kernel_table.KERNEL_NAMES)  # nothing outside the table


def test_bind_refuses_a_runtime_missing_a_kernel():
    namespace = {f"_{name}": print for name in kernel_table.KERNEL_NAMES.values()}
    del namespace["_feed_forward"]
    with pytest.raises(ValueError, match="_feed_forward"):
        kernel_table.bind(namespace)


# --- one parity case per layer type ------------------------------------------------------------------------


class Case(NamedTuple):
    """A layer, its step inputs (name -> numpy), and how a step calls it: `call(layer_call, inputs, onnx)` with
    `layer_call` the Keras layer or a runtime's kernel bound to it, `inputs` tensors (or ONNX `Value`s) and
    `onnx` whether the call builds the ONNX graph (whose positions come from `position_ids`, and whose cache
    input is the past alone: the graph returns the past and the new position)."""

    layer: keras.layers.Layer
    inputs: dict
    call: Callable


def _rng():
    return np.random.default_rng(7)


def _x(width=D):
    return _rng().normal(size=(B, 1, width)).astype("float32")  # (B, T=1, D)


def _residual_norm(layer):
    # norm(x + h): a residual sum, which the ONNX kernels fuse into the norm (Skip...Normalization).
    return Case(layer, {"x": _x(), "h": _x() * 0.5 + 1.0}, lambda call, v, onnx: call(v["x"] + v["h"]))


def _offset_rms_norm():
    # Gemma's (1 + w) scale, w random (a kernel that drops the offset or w is off by far more than the tolerance).
    layer = RMSNormalization(scale_offset=1.0)
    layer.build((B, 1, D))
    layer.scale.assign(_rng().normal(size=(D,)).astype("float32"))
    return _residual_norm(layer)


def _reversible_embedding():
    layer = keras.layers.ReversibleEmbedding(50, D, tie_weights=True)
    ids = _rng().integers(0, 50, (B, 1)).astype("int64")
    return Case(
        layer, {"ids": ids, "x": _x()}, lambda call, v, onnx: (call(v["ids"]), call(v["x"], reverse=True))
    )  # (B, 1, D), (B, 1, V)


def _positional_embedding():
    layer = PositionalEmbedding(16)
    return Case(layer, {"x": _x()}, lambda call, v, onnx: call(v["x"], start_index=POSITION))


def _dense():
    return Case(keras.layers.Dense(24), {"x": _x()}, lambda call, v, onnx: call(v["x"]))


def _dropout():
    return Case(keras.layers.Dropout(0.5), {"x": _x()}, lambda call, v, onnx: call(v["x"]))


def _relative_position_bias():
    # The causal (decoder) bias of the new query against keys [0, POSITION]: (1, H, 1, POSITION + 1).
    layer = RelativePositionBias(num_heads=2, num_buckets=4, max_distance=8, bidirectional=False)
    keys = np.zeros((B, POSITION + 1, D), "float32")
    return Case(
        layer, {"query": _x(), "key": keys}, lambda call, v, onnx: call(v["query"], v["key"], query_start=POSITION)
    )


def _feed_forward():
    return Case(FeedForward(48, activation="gated-gelu"), {"x": _x()}, lambda call, v, onnx: call(v["x"]))


def _mixture_of_experts():
    # B rows of one token, each through its top 2 of 4 experts, OLMoE's unnormalised weights, and Qwen2-MoE's gated
    # shared expert (the whole-step tests hold Mixtral's renormalised top-k, and longer inputs, to Keras).
    layer = MixtureOfExperts(
        num_experts=4,
        top_k=2,
        intermediate_dim=12,
        normalize_top_k=False,
        shared_intermediate_dim=8,
        shared_expert_gate=True,
    )
    return Case(layer, {"x": _x()}, lambda call, v, onnx: call(v["x"]))


def _decoder_block():
    # A pre-norm block's step: the new token attends the POSITION cached keys/values and its own.
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=48, norm_first=True)
    past = {
        f"past_key_values.0.{part}": _rng().normal(size=(B, 2, POSITION, D // 2)).astype("float32")
        for part in ("key", "value")
    }  # (B, Hkv, S, Dh)

    def call(layer_call, v, onnx):
        cache = [v["past_key_values.0.key"], v["past_key_values.0.value"]]
        if not onnx:  # a buffer of POSITION + 1 positions, the last one written by the step
            cache = [ops.pad(c, [(0, 0), (0, 0), (0, 1), (0, 0)]) for c in cache]
        x, (keys, values) = layer_call(v["x"], self_attention_cache=tuple(cache), cache_index=POSITION)
        return x, keys, values

    return Case(block, {"x": _x(), **past}, call)


CASES = {
    keras.layers.ReversibleEmbedding: _reversible_embedding,
    PositionalEmbedding: _positional_embedding,
    keras.layers.LayerNormalization: lambda: _residual_norm(keras.layers.LayerNormalization()),
    keras.layers.RMSNormalization: lambda: _residual_norm(keras.layers.RMSNormalization()),
    RMSNormalization: _offset_rms_norm,
    keras.layers.Dense: _dense,
    keras.layers.Dropout: _dropout,
    RelativePositionBias: _relative_position_bias,
    FeedForward: _feed_forward,
    MixtureOfExperts: _mixture_of_experts,
    TransformerDecoderBlock: _decoder_block,
}


def test_every_layer_type_has_a_parity_case():
    assert set(CASES) == set(kernel_table.KERNEL_NAMES)


def _flat(outputs):
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def _keras(case):
    """The Keras layer's outputs (it builds the layer), then its weights drawn at random (norms' scales too)."""
    tensors = {name: ops.convert_to_tensor(value) for name, value in case.inputs.items()}
    case.call(case.layer, tensors, False)
    rng = np.random.default_rng(3)
    for variable in case.layer.weights:
        if variable.dtype == "float32":
            variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    return [ops.convert_to_numpy(y) for y in _flat(case.call(case.layer, tensors, False))]


def _torch(case, kernel):
    import torch

    kernels = torch_kernels.TorchKernels()  # the eager kernels: the cache index read as an int
    tensors = {name: torch.as_tensor(value) for name, value in case.inputs.items()}
    outputs = _flat(case.call(lambda *args, **kwargs: kernel(kernels, case.layer, *args, **kwargs), tensors, False))
    assert all(y is not NotImplemented for y in outputs), "the kernel handed the call back to Keras"
    return [y.detach().cpu().numpy() for y in outputs]


def _onnx(case, kernel):
    builder = _Builder()
    kernels = OnnxKernels(builder, max_positions=16)
    values = {name: Value(builder, name) for name in case.inputs}
    outputs = [
        builder.node("Identity", [y.materialize()])
        for y in _flat(case.call(lambda *args, **kwargs: kernel(kernels, case.layer, *args, **kwargs), values, True))
    ]
    feeds = {**case.inputs, "position_ids": np.full((B, 1), POSITION, np.int64)}
    types = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64}
    graph = helper.make_graph(
        builder.nodes,
        "case",
        [helper.make_tensor_value_info(name, types[value.dtype], value.shape) for name, value in feeds.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        builder.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSET_IMPORTS], ir_version=8)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    used = {graph_input.name for graph_input in session.get_inputs()}
    return session.run(outputs, {name: value for name, value in feeds.items() if name in used})


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("layer_type", list(kernel_table.KERNEL_NAMES), ids=lambda t: t.__name__)
def test_kernel_matches_the_keras_layer(runtime, layer_type):
    if runtime == "torch" and not ON_TORCH:
        pytest.skip("PyTorch's kernels run on the PyTorch backend only (elsewhere Keras runs the layers)")
    keras.utils.set_random_seed(0)
    case = CASES[layer_type]()
    expected = _keras(case)
    kernel = RUNTIMES[runtime][layer_type]
    actual = _torch(case, kernel) if runtime == "torch" else _onnx(case, kernel)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        shape = np.broadcast_shapes(got.shape, want.shape)  # a (1, ...) result may stand for every row
        assert shape in (got.shape, want.shape) and got.size > 1
        np.testing.assert_allclose(np.broadcast_to(got, shape), np.broadcast_to(want, shape), atol=1e-4, rtol=1e-4)
