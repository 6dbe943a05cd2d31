"""An LM's decode step (and a causal LM's prefill) as ONNX graphs, built by running its own step with ONNX
kernels per layer type.

Axes: B rows, T new tokens (1 in a decode step), S_buf cache buffer length, S_enc encoder length, H heads,
Hkv key/value heads, Dh head size, D model width, F feed-forward width, V vocabulary, P positions.

    causal LM  input_ids (B, T), position_ids (B, T) (the new tokens' positions S .. S + T - 1 after the row's
               past of S), past_key_values.{i}.key/value (B, Hkv, S_buf, Dh)
      -> logits (B, T, V), present.{i}.key/value (B, Hkv, S_buf, Dh)
    seq2seq    the same, and encoder_attention_mask (B, S_enc) (after position_ids),
               cross_key_values.{i}.key/value (B, Hkv, S_enc, Dh) (after the pasts)
    prefill    (causal LM) input_ids (B, T), attention_mask (B, T) (right padding)
      -> logits (B, T, V), present.{i}.key/value (B, T, Hkv, Dh)

The family's own step (`backbone.call_with_cache` + `task.compute_logits`, written once in its
files) runs with `OnnxKernels` as its `call_layer` and symbolic `Value`s for tensors: each
layer call adds that layer type's ONNX nodes, reading the layer's weights. Any family built
from the layer types here gets the graph (pre- or post-norm blocks, layer or RMS norms, rotary
or learned positions, a sliding window, T5's relative position bias, cross-attention over the
encoder's keys/values); a step that needs something else raises `Unsupported`, and the export
falls back to the step traced by tf2onnx (graphs.py).

The decode step takes T >= 1 new tokens per row after its past (a symbolic token axis, as fast as a fixed one
for T = 1; benchmarks/RESULTS.md, "Prefix caching and the multi-token decode step"): a prompt prefilled after a
cached prefix, or a speculative verify pass.
ONNX Runtime's GroupQueryAttention (CPU, 1.31) reads each row's past as its total length (seqlens_k + 1)
minus T, and refuses T > 1 after a past in a batch of more than one row: such a step runs a row at a time.

Why not the tf2onnx step: it concatenates every layer's whole past to the new keys/values and
transposes the result twice, a copy of the cache per step that dominated batched and beam
decoding. ONNX Runtime's GroupQueryAttention (com.microsoft domain, CPU kernel) reads the first
S + 1 slots of a buffer and, when the present is bound to the very same memory as the past (IO
binding), writes the new position into it in place: the runner keeps one buffer per cache for
the whole generation. Called with a past of exactly S positions and no binding, the same graph
returns presents of S + 1 positions (the growing form the parity tests use). The kernels also
emit what ONNX Runtime fuses: one QKV MatMul, rotary positions inside GroupQueryAttention,
residual additions inside Skip(Simplified)LayerNormalization (a residual sum stays pending until
the next norm takes it), feed-forward biases inside FastGelu/BiasGelu.
"""

import numpy as np

from keras_transformer.export import quantize as quantization  # not `quantize`: the builders take a quantize= mode
from keras_transformer.progress import QUIET
from keras_transformer.kernels import onnx_kernels
from keras_transformer.kernels.onnx_values import Unsupported, Value
from keras_transformer.models.seq2seq_lm import Seq2SeqLM

OPSET_IMPORTS = (("", 17), ("com.microsoft", 1))


def decode_model(task, weights=None, quantize=None, phase=QUIET):
    """`task` (a causal or seq2seq LM whose step the kernels cover) -> the checked ONNX ModelProto of its
    in-place decode step; `Unsupported` otherwise. With a `weights_file.WeightsFile`, its large initializers
    point into that file (written there once, shared with the bundle's other graphs); else they are inline.
    `quantize` ("int8" or "int4"): the weights stored quantized (see `_Builder.matmul`). `phase`: a
    `progress.Phase`, stepped after each of the backbone's blocks."""
    from onnx import TensorProto, helper

    backbone = task.backbone
    if not hasattr(task, "compute_logits"):
        raise Unsupported(f"{type(task).__name__} has no `compute_logits`.")
    seq2seq = isinstance(task, Seq2SeqLM)
    _, layers, _, kv_heads, _, head_dim = backbone.cache_shape(1, 1)
    builder = _Builder(weights, quantize)
    kernels = OnnxKernels(builder, max_positions=getattr(backbone, "max_sequence_length", None), phase=phase)
    inputs = [  # T new tokens per row (1 in a decode step), at positions S_b .. S_b + T - 1 after each row's past
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "position_ids")
    ]
    if seq2seq:
        inputs.append(
            helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT64, ["batch", "encoder_sequence"])
        )

    def caches(prefix, axis):
        pairs = []
        for i in range(layers):
            names = [f"{prefix}.{i}.{part}" for part in ("key", "value")]
            inputs.extend(
                helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", kv_heads, axis, head_dim])
                for name in names
            )
            pairs.append(tuple(Value(builder, name) for name in names))
        return pairs

    past = caches("past_key_values", "past_sequence")
    if seq2seq:
        cross = caches("cross_key_values", "encoder_sequence")
        hidden, present = backbone.call_with_cache(
            Value(builder, "input_ids"),
            past,
            Value(builder, "position_ids"),
            cross,
            Value(builder, "encoder_attention_mask"),
            call_layer=kernels,
        )
    else:
        hidden, present = backbone.call_with_cache(
            Value(builder, "input_ids"), past, Value(builder, "position_ids"), call_layer=kernels
        )
    logits = task.compute_logits(hidden, call_layer=kernels)
    builder.rename(logits.materialize(), "logits")
    vocabulary = int(backbone.vocabulary_size)
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocabulary])]
    outputs += _present_outputs(present, ["batch", kv_heads, "present_sequence", head_dim])
    return _model(builder, "decoder" if seq2seq else "decode", inputs, outputs, weights)


def prefill_model(task, weights=None, quantize=None, phase=QUIET):
    """`task` (a causal LM whose step the kernels cover) -> the checked ONNX ModelProto of its prefill:

        input_ids (B, T), attention_mask (B, T) (ones, then zeros: right padding)
          -> logits (B, T, V), present.{i}.key/value (B, T, Hkv, Dh)

    The same step as `decode_model`, run on T tokens from position 0 with no past: GroupQueryAttention's
    prompt form, each row attending its first `sum(attention_mask)` positions causally. A padded position's
    logits are not the model's (as in the traced prefill: nothing real follows it); a left-padded mask is
    not what this graph reads. `Unsupported` for a seq2seq LM or a step the kernels do not build."""
    from onnx import TensorProto, helper

    if isinstance(task, Seq2SeqLM) or not hasattr(task, "compute_logits"):
        raise Unsupported(f"{type(task).__name__} has no prefill graph built by the kernels.")
    backbone = task.backbone
    _, layers, _, kv_heads, _, head_dim = backbone.cache_shape(1, 1)
    builder = _Builder(weights, quantize)
    kernels = OnnxKernels(
        builder, max_positions=getattr(backbone, "max_sequence_length", None), prefill=True, phase=phase
    )
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask")
    ]
    # No past: the kernels read these names as "nothing cached" and name their presents after them.
    past = [tuple(Value(builder, f"past_key_values.{i}.{part}") for part in ("key", "value")) for i in range(layers)]
    hidden, present = backbone.call_with_cache(
        Value(builder, "input_ids"), past, Value(builder, "position_ids"), call_layer=kernels
    )
    logits = task.compute_logits(hidden, call_layer=kernels)
    builder.rename(logits.materialize(), "logits")
    vocabulary = int(backbone.vocabulary_size)
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocabulary])]
    outputs += _present_outputs(present, ["batch", "sequence", kv_heads, head_dim])
    return _model(builder, "prefill", inputs, outputs, weights)


def _model(builder, name, inputs, outputs, weights):
    import onnx
    from onnx import helper

    model = helper.make_model(
        helper.make_graph(builder.nodes, name, inputs, outputs, builder.initializers),
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in OPSET_IMPORTS],
        ir_version=8,  # what tf2onnx writes for opset 17; ONNX Runtime reads IR versions up to 13
        producer_name="keras_transformer",
    )
    if weights is None:
        onnx.checker.check_model(model)  # with a weights file, checked once saved (its tensors are in the file)
    return model


def _present_outputs(present, shape):
    """The step's caches as graph outputs of `shape` (the decode graph's (B, Hkv, S + 1, Dh), the prefill's
    (B, T, Hkv, Dh)); each must come from the self-attention kernel, or the step is `Unsupported`."""
    from onnx import TensorProto, helper

    outputs = []
    for i, pair in enumerate(present):
        for part, value in zip(("key", "value"), pair):
            if value.name != f"present.{i}.{part}":
                raise Unsupported(f"layer {i}'s cache did not come from a GroupQueryAttention node")
            outputs.append(helper.make_tensor_value_info(value.name, TensorProto.FLOAT, shape))
    return outputs


class OnnxKernels:
    """`call_layer` for the decode and prefill graphs: each known layer type adds its ONNX nodes; anything else is
    `Unsupported`.

    A decode step reads each row's positions from `position_ids` (B, T) (T consecutive ones after its past); a
    prefill (`prefill=True`) runs positions [0, T) of every row, its lengths from `attention_mask`.
    GroupQueryAttention takes each row's last position and the longest total length, computed once for all
    layers; tables indexed by position (rotary cos/sin) have `max_positions` rows.
    """

    def __init__(self, builder, max_positions, prefill=False, phase=QUIET):
        from onnx import TensorProto

        self.builder, self.max_positions, self.prefill, self.phase = builder, max_positions, prefill, phase
        self._memo = {}
        if prefill:  # rows of T tokens from position 0; `attention_mask` (B, T) gives each row's length
            self.total_length_int64 = builder.node(
                "Gather", [builder.node("Shape", ["input_ids"]), builder.const("index", np.array(1))]
            )  # T
            positions = builder.node(
                "Range",
                [builder.const("zero", np.array(0)), self.total_length_int64, builder.const("one", np.array(1))],
            )  # (T,)
            builder.node("Expand", [positions, builder.node("Shape", ["input_ids"])], names=["position_ids"])  # (B, T)
            lengths = builder.node("ReduceSum", ["attention_mask", builder.const("axis_1", np.array([1]))], keepdims=0)
            last = builder.node("Sub", [lengths, builder.const("one", np.array(1))])  # (B,): each row's last position
        else:  # T tokens per row at its `position_ids` (B, T), consecutive after the row's past
            last = builder.node("ReduceMax", ["position_ids"], axes=[1], keepdims=0)  # (B,)
            self.total_length_int64 = builder.node(
                "Add", [builder.node("ReduceMax", ["position_ids"], keepdims=0), builder.const("one", np.array(1))]
            )
        # GroupQueryAttention's seqlens_k (each row's total length - 1) and total_sequence_length, int32.
        self.past_lengths = builder.node("Cast", [last], to=TensorProto.INT32)  # (B,)
        self.total_length = builder.node("Cast", [self.total_length_int64], to=TensorProto.INT32)  # ()

    def memo(self, key, make):
        """`make()` once per graph for `key` (a table or mask shared by every layer)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def __call__(self, layer, *args, **kwargs):
        kernel = onnx_kernels.KERNELS.get(type(layer))
        if kernel is None:
            raise Unsupported(f"no ONNX kernel for a {type(layer).__name__} layer")
        outputs = kernel(self, layer, *args, **kwargs)
        if onnx_kernels.is_block(layer):
            self.phase.step()
        return outputs


class _Builder:
    """Nodes and initializers, named from their order (the same model gives the same bytes); large initializers
    go to `weights` (a `WeightsFile`) when one is given. `quantize` ("int8", "int4" or None): how `matmul` and
    `gather` store their weights."""

    def __init__(self, weights=None, quantize=None):
        self.nodes, self.initializers, self.weights, self.quantize = [], [], weights, quantize

    def const(self, name, value):
        """An initializer; its name starts with its index (layer names repeat across blocks)."""
        from onnx import numpy_helper

        name = f"const_{len(self.initializers)}_{name}"
        value = np.asarray(value)
        tensor = numpy_helper.from_array(value, name) if self.weights is None else self.weights.tensor(name, value)
        self.initializers.append(tensor)
        return name

    def scalar(self, value):
        return self.const("scalar", np.float32(value))

    def node(self, op, inputs, outputs=1, domain="", names=None, **attributes):
        from onnx import helper

        position = len(self.nodes)
        # None: a generated name; "": an optional output left out.
        names = [
            f"{op.lower()}_{position}_{j}" if name is None else name for j, name in enumerate(names or [None] * outputs)
        ]
        self.nodes.append(helper.make_node(op, inputs, names, name=f"{op}_{position}", domain=domain, **attributes))
        return names[0] if outputs == 1 else names

    def matmul(self, x, name, kernel, transposed=False):
        """x (..., K) @ kernel (K, N), a float32 numpy weight (`transposed`: kernel is (N, K), e.g. a tied table read
        as the output projection). Quantized as ONNX Runtime's own quantizers store weights: "int8" as
        `quantize_dynamic` does (int8 weights, per tensor; activations quantized at run time, MatMulInteger),
        "int4" as MatMulNBits (blocks of 32 along K)."""
        from onnx import TensorProto

        if self.quantize is None:
            weight = self.const(name, kernel)
            if transposed:  # folded by ONNX Runtime when the session loads; the file holds the table once
                weight = self.node("Transpose", [weight], perm=[1, 0])
            return self.node("MatMul", [x, weight])
        kernel = np.ascontiguousarray(kernel.T) if transposed else kernel
        if self.quantize == "int4":
            packed, scales, zero_points = quantization.int4_blocks(kernel)
            parameters = [
                self.const(f"{name}.{part}", v)
                for part, v in zip(("int4", "scales", "zeros"), (packed, scales, zero_points))
            ]
            return self.node(
                "MatMulNBits",
                [x, *parameters],
                domain="com.microsoft",
                K=kernel.shape[0],
                N=kernel.shape[1],
                **quantization.NBITS_ATTRIBUTES,
            )
        weights, scale, zero_point = quantization.int8_weight(kernel)
        x, x_scale, x_zero_point = self.node("DynamicQuantizeLinear", [x], outputs=3)
        product = self.node(
            "MatMulInteger",
            [x, self.const(f"{name}.int8", weights), x_zero_point, self.const(f"{name}.zero_point", zero_point)],
        )
        scale = self.node("Mul", [x_scale, self.const(f"{name}.scale", scale)])
        return self.node("Mul", [self.node("Cast", [product], to=TensorProto.FLOAT), scale])

    def gather(self, name, table, ids):
        """The rows of `table` (float32 numpy) at `ids`; stored in int8 (per tensor, dequantized after the Gather, as
        `quantize_dynamic` stores tables) when the builder quantizes, in either mode."""
        if self.quantize is None:
            return self.node("Gather", [self.const(name, table), ids])
        weights, scale, zero_point = quantization.int8_weight(table)
        rows = self.node("Gather", [self.const(f"{name}.int8", weights), ids])
        return self.node(
            "DequantizeLinear", [rows, self.const(f"{name}.scale", scale), self.const(f"{name}.zero_point", zero_point)]
        )

    def rename(self, name, new_name):
        """Give the tensor `name` (made by the last node) the graph output's name."""
        last = self.nodes[-1]
        if name not in last.output:
            raise Unsupported(f"{new_name} is not made by the last node")
        last.output[list(last.output).index(name)] = new_name


__all__ = ["OPSET_IMPORTS", "OnnxKernels", "Unsupported", "Value", "decode_model", "prefill_model"]
