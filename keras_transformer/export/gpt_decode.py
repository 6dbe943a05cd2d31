"""GPT's decode step as an ONNX graph built node by node, with key/value caches written in place.

Axes: B rows, T = 1 new token, S_buf cache buffer length, H heads, Hkv key/value heads,
Dh head size, D model width, F feed-forward width, V vocabulary, P positions.

    decode  input_ids (B, 1), position_ids (B, 1) (the new token's position S),
            past_key_values.{i}.key/value (B, Hkv, S_buf, Dh)
      -> logits (B, 1, V), present.{i}.key/value (B, Hkv, S_buf, Dh)

Why not the tf2onnx step: it concatenates every layer's whole past to the new keys/values
and transposes the result twice, a copy of the cache per step that dominated batched and
beam decoding. ONNX Runtime's GroupQueryAttention (com.microsoft domain, CPU kernel) reads
the first S + 1 slots of a buffer and, when the present is bound to the very same memory as
the past (IO binding), writes the new position into it in place: the runner keeps one buffer
per cache for the whole generation. Called with a past of exactly S positions and no
binding, the same graph returns presents of S + 1 positions (the growing form the parity
tests use). Written from the layers' weights, the step also has fewer nodes, which is what
ONNX Runtime's speed depends on at small sizes: one QKV MatMul, residual additions inside
SkipLayerNormalization, feed-forward biases inside FastGelu/BiasGelu (45 nodes for 4 layers,
against 153 for the converted step after ONNX Runtime's own fusions).

The computation is `GPTBackbone.call_with_cache` (pre-norm blocks, learned positions, tied
output embedding); the parity tests hold the graph to the Keras model.
"""

import numpy as np

OPSET_IMPORTS = (("", 17), ("com.microsoft", 1))


def decode_model(task):
    """`task` (a GPTCausalLM) -> the checked ONNX ModelProto of its in-place decode step."""
    import onnx
    from onnx import TensorProto, helper

    backbone = task.backbone
    graph = _Builder()
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", 1]),
    ]
    outputs = []

    tokens = graph.node("Gather", [graph.const("token_embeddings", _weight(backbone.token_embedding.embeddings)),
                                   "input_ids"])  # (B, 1) -> (B, 1, D)
    positions = graph.const("position_embeddings", _weight(backbone.position_embedding.embeddings))  # (P, D)
    positions = graph.node("Gather", [positions, "position_ids"])  # (B, 1) -> (B, 1, D)
    # GroupQueryAttention takes each row's past length (int32) and the longest total length.
    seqlens = graph.node("Cast", [graph.node("Squeeze", ["position_ids", graph.const("axis_1", np.array([1]))])],
                         to=TensorProto.INT32)  # (B,)
    total = graph.node("Add", [graph.node("ReduceMax", ["position_ids"], keepdims=0), graph.const("one", np.array(1))])
    total = graph.node("Cast", [total], to=TensorProto.INT32)  # ()

    # The residual stream x and the branch still to be added to it (with its bias): each
    # addition is done by the next norm (SkipLayerNormalization), as ONNX Runtime fuses it.
    x, branch = tokens, (positions, None)
    for i, block in enumerate(backbone.transformer_layers):
        if not block.norm_first:
            raise ValueError(f"The in-place GPT decode graph expects pre-norm blocks. Received: block {i} post-norm")
        attention = block.self_attention
        kv_heads, head_dim = attention._kv_heads, attention._head_dim
        past = [f"past_key_values.{i}.{part}" for part in ("key", "value")]
        present = [f"present.{i}.{part}" for part in ("key", "value")]
        for name in past:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", kv_heads, "past_sequence",
                                                                                  head_dim]))
        for name in present:
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", kv_heads,
                                                                                   "present_sequence", head_dim]))
        prefix = f"layer_{i}"
        h, x = graph.norm(f"{prefix}.attention_norm", block.self_attention_norm, x, *branch)
        dense = (attention.query_dense, attention.key_dense, attention.value_dense)
        # (D, H, Dh), (D, Hkv, Dh), (D, Hkv, Dh) -> (D, (H + 2 Hkv) Dh): one MatMul gives the packed QKV GQA reads.
        kernel = np.concatenate([_weight(d.kernel).reshape(backbone.hidden_dim, -1) for d in dense], axis=1)
        qkv = graph.node("MatMul", [h, graph.const(f"{prefix}.qkv.kernel", kernel)])  # (B, 1, (H + 2 Hkv) Dh)
        if attention.query_dense.bias is not None:
            bias = np.concatenate([_weight(d.bias).reshape(-1) for d in dense])
            qkv = graph.node("Add", [qkv, graph.const(f"{prefix}.qkv.bias", bias)])
        h = graph.node("GroupQueryAttention", [qkv, "", "", past[0], past[1], seqlens, total], outputs=3,
                       domain="com.microsoft", num_heads=attention.num_heads, kv_num_heads=kv_heads,
                       scale=float(attention._scale), names=[None, present[0], present[1]])[0]  # (B, 1, H Dh)
        # (H, Dh, D) -> (H Dh, D)
        branch = graph.dense(f"{prefix}.attention_output", h, attention.output_dense, (-1, backbone.hidden_dim))
        h, x = graph.norm(f"{prefix}.feed_forward_norm", block.feed_forward_norm, x, *branch)
        branch = graph.feed_forward(f"{prefix}.feed_forward", block.feed_forward, h)

    x, _ = graph.norm("layer_norm", backbone.layer_norm, x, *branch)
    embedding = backbone.token_embedding
    reverse = _weight(embedding.embeddings).T if embedding.tie_weights else _weight(embedding.reverse_embeddings)
    logits = graph.node("MatMul", [x, graph.const("output_embeddings", np.ascontiguousarray(reverse))])  # (B, 1, V)
    cap = getattr(embedding, "logit_soft_cap", None)
    if cap:  # cap * tanh(logits / cap)
        cap = graph.const("logit_soft_cap", np.float32(cap))
        logits = graph.node("Mul", [graph.node("Tanh", [graph.node("Div", [logits, cap])]), cap])
    graph.nodes[-1].output[0] = "logits"  # the last node makes the logits: give them the graph output's name
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1,
                                                                                   int(backbone.vocabulary_size)]))
    model = helper.make_model(
        helper.make_graph(graph.nodes, "decode", inputs, outputs, graph.initializers),
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in OPSET_IMPORTS],
        ir_version=8,  # what tf2onnx writes for opset 17; ONNX Runtime reads IR versions up to 13
        producer_name="keras_transformer",
    )
    onnx.checker.check_model(model)
    return model


def _weight(variable):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable), np.float32)


class _Builder:
    """Nodes and initializers, named from their order (the same model gives the same bytes)."""

    def __init__(self):
        self.nodes, self.initializers = [], []

    def const(self, name, value):
        from onnx import numpy_helper

        name = f"const_{name}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op, inputs, outputs=1, domain="", names=None, **attributes):
        from onnx import helper

        position = len(self.nodes)
        # None: a generated name; "": an optional output left out.
        names = [f"{op.lower()}_{position}_{j}" if name is None else name
                 for j, name in enumerate(names or [None] * outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=f"{op}_{position}", domain=domain, **attributes))
        return names[0] if outputs == 1 else names

    def dense(self, name, x, layer, shape=None):
        """x @ kernel, as (output, bias or None): the bias is left to the op that follows."""
        kernel = _weight(layer.kernel)
        y = self.node("MatMul", [x, self.const(f"{name}.kernel", kernel if shape is None else kernel.reshape(shape))])
        return y, None if layer.bias is None else self.const(f"{name}.bias", _weight(layer.bias).reshape(-1))

    def norm(self, name, layer, x, branch=None, bias=None):
        """LayerNormalization of x + branch (+ bias) -> (normalized, x + branch + bias)."""
        import keras

        plain = type(layer) is keras.layers.LayerNormalization and layer.scale and layer.center
        if not plain or layer.rms_scaling:
            raise ValueError(f"The in-place GPT decode graph supports LayerNormalization. Received: {layer!r}")
        gamma, beta = self.const(f"{name}.gamma", _weight(layer.gamma)), self.const(f"{name}.beta", _weight(layer.beta))
        if branch is None:
            return self.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=float(layer.epsilon)), x
        inputs = [x, branch, gamma, beta] + ([bias] if bias is not None else [])
        normalized, total = self.node("SkipLayerNormalization", inputs, outputs=4, domain="com.microsoft",
                                      names=[None, "", "", None], epsilon=float(layer.epsilon))[::3]
        return normalized, total

    def feed_forward(self, name, layer, x):
        """`FeedForward.call` at inference: (B, 1, D) -> (output (B, 1, D), its bias or None)."""
        if not layer._gated:
            hidden = self.activation(layer.activation, *self.dense(f"{name}.intermediate", x, layer.intermediate_dense))
        else:  # act(x W_gate) * (x W_in); "gated-gelu" is the tanh approximation
            hidden, bias = self.dense(f"{name}.intermediate", x, layer.intermediate_dense)
            if bias is not None:
                hidden = self.node("Add", [hidden, bias])
            base = "gelu_approximate" if layer.activation == "gated-gelu" else layer.activation.removeprefix("gated-")
            hidden = self.node("Mul", [self.activation(base, *self.dense(f"{name}.gate", x, layer.gate_dense)), hidden])
        return self.dense(f"{name}.output", hidden, layer.output_dense)  # (B, 1, F) -> (B, 1, D)

    def activation(self, name, x, bias=None):
        """act(x + bias), with the bias inside the kernel where ONNX Runtime has one."""
        if name == "gelu_approximate":  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            return self.node("FastGelu", [x] + ([bias] if bias is not None else []), domain="com.microsoft")
        if name == "gelu":  # 0.5 x (1 + erf(x / sqrt 2))
            return self.node("BiasGelu" if bias is not None else "Gelu", [x] + ([bias] if bias is not None else []),
                             domain="com.microsoft")
        if bias is not None:
            x = self.node("Add", [x, bias])
        if name == "relu":
            return self.node("Relu", [x])
        if name == "silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        raise ValueError(f"The in-place GPT decode graph has no activation {name!r}.")
