"""The tensors a Hugging Face checkpoint of our task stores: {name: shape}, as `transformers` holds them.

The exports run a family's converter backwards against this table (`WeightRecorder`, weight_recorder.py): the
Hugging Face folder (hf_export.py) and GGUF (gguf_export.py, which then renames the tensors). It needs neither
`torch` nor `transformers`. Tied copies (a head that is the token embedding, T5's per-stack embeddings, a masked-LM
decoder) are not listed: the checkpoint does not store them, and the converter's `check_same` on a name not listed
is a no-op.

tests/convert/test_hf_export.py checks each layout against the tensors `transformers`' own `save_pretrained` writes.

Axes: D width, V vocabulary, F feed-forward width, H query heads, Hkv key/value heads, Dh head size, E experts,
I an expert's width, C classes.
"""

import numpy as np

from keras_transformer.convert import hf_bert

_BERT_TYPES = ("bert", "roberta", "distilbert")


def checkpoint_shapes(task, model_type, stacked_experts=False):
    """{Hugging Face tensor name: shape} of the checkpoint `task` stands for, in the layout of `model_type` (the
    config's `model_type`; a decoder family's GGUF architecture name reads as the same layout). A mixture of experts'
    experts are one tensor each, as checkpoints store them, or `stacked_experts` as transformers 5 holds them."""
    if model_type == "gpt2":
        return _gpt2(task.backbone)
    if model_type in _BERT_TYPES:
        return _bert(task, model_type)
    if model_type == "modernbert":
        return _modernbert(task)
    if model_type == "t5":
        return _t5(task)
    return _decoder(task.backbone, model_type, stacked_experts)


def _gpt2(b):
    D, F = b.hidden_dim, b.intermediate_dim
    shapes = {"transformer.wte.weight": (b.vocabulary_size, D), "transformer.wpe.weight": (b.max_sequence_length, D)}
    for i in range(b.num_layers):
        p = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            shapes.update({f"{p}{norm}.weight": (D,), f"{p}{norm}.bias": (D,)})
        shapes.update({p + "attn.c_attn.weight": (D, 3 * D), p + "attn.c_attn.bias": (3 * D,)})  # Conv1D: (in, out)
        shapes.update({p + "attn.c_proj.weight": (D, D), p + "attn.c_proj.bias": (D,)})
        shapes.update({p + "mlp.c_fc.weight": (D, F), p + "mlp.c_fc.bias": (F,)})
        shapes.update({p + "mlp.c_proj.weight": (F, D), p + "mlp.c_proj.bias": (D,)})
    shapes.update({"transformer.ln_f.weight": (D,), "transformer.ln_f.bias": (D,)})
    return shapes


def _decoder(b, model_type, stacked):
    """Llama, Qwen2, Qwen3, SmolLM3, Mistral, Phi-3 (fused projections), Gemma 2 and 3 (four norms per layer) and the
    mixtures of experts (`_experts`): torch `Linear` weights (out, in)."""
    D, V, F = b.hidden_dim, b.vocabulary_size, b.intermediate_dim
    H, Hkv = b.num_heads, b.num_key_value_heads or b.num_heads
    Dh = b.head_dim or D // H
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(b.num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,)})
        if model_type.startswith("gemma"):
            shapes.update({p + "pre_feedforward_layernorm.weight": (D,), p + "post_feedforward_layernorm.weight": (D,)})
        if model_type == "phi3":  # fused: [q | k | v] and [gate | up] rows
            shapes.update(
                {p + "self_attn.qkv_proj.weight": ((H + 2 * Hkv) * Dh, D), p + "mlp.gate_up_proj.weight": (2 * F, D)}
            )
            shapes.update({p + "self_attn.o_proj.weight": (D, H * Dh), p + "mlp.down_proj.weight": (D, F)})
            continue
        shapes.update(_attention(b, p, D, H, Hkv, Dh))
        if b.query_key_norm == "head":  # Qwen3, Gemma 3: per head
            shapes.update({p + "self_attn.q_norm.weight": (Dh,), p + "self_attn.k_norm.weight": (Dh,)})
        elif b.query_key_norm == "full":  # OLMoE: over all heads
            shapes.update({p + "self_attn.q_norm.weight": (H * Dh,), p + "self_attn.k_norm.weight": (Hkv * Dh,)})
        moe = getattr(b, "mixture_of_experts", None)
        if moe and (b.moe_layers is None or b.moe_layers[i]):
            shapes.update(_experts(moe, p, D, model_type, stacked))
            continue
        for name, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            shapes[f"{p}mlp.{name}.weight"] = shape
            if getattr(b, "mlp_bias", False):
                shapes[f"{p}mlp.{name}.bias"] = shape[:1]
    if not b.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def _experts(moe, p, D, model_type, stacked):
    """A sparse layer's router and experts (hf_moe.py reads both layouts): `stacked`, as transformers 5 holds them,
    (E, 2 I, D) with the gate's rows first and (E, D, I); else one torch `Linear` per expert, as the Hub's checkpoints
    and transformers' `save_pretrained` store them (Mixtral's under `block_sparse_moe`, named w1 / w3 / w2), with
    Qwen2-MoE's shared expert and its gate."""
    E, I = moe["num_experts"], moe["intermediate_dim"]
    if stacked:
        return {
            p + "mlp.gate.weight": (E, D),
            p + "mlp.experts.gate_up_proj": (E, 2 * I, D),
            p + "mlp.experts.down_proj": (E, D, I),
        }
    block = p + ("block_sparse_moe." if model_type == "mixtral" else "mlp.")
    gate, up, down = ("w1", "w3", "w2") if model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    shapes = {block + "gate.weight": (E, D)}
    for e in range(E):
        shapes.update({f"{block}experts.{e}.{gate}.weight": (I, D), f"{block}experts.{e}.{up}.weight": (I, D)})
        shapes[f"{block}experts.{e}.{down}.weight"] = (D, I)
    shared = moe.get("shared_intermediate_dim")
    if shared is not None:
        shapes.update({f"{block}shared_expert.{name}.weight": (shared, D) for name in ("gate_proj", "up_proj")})
        shapes.update(
            {block + "shared_expert.down_proj.weight": (D, shared), block + "shared_expert_gate.weight": (1, D)}
        )
    return shapes


def _attention(b, p, D, H, Hkv, Dh):
    output_bias = getattr(b, "attention_output_bias", None)  # Gemma: one switch for all four projections
    output_bias = b.attention_bias if output_bias is None else output_bias
    shapes = {}
    for proj, rows in (("q_proj", H * Dh), ("k_proj", Hkv * Dh), ("v_proj", Hkv * Dh)):
        shapes[f"{p}self_attn.{proj}.weight"] = (rows, D)
        if b.attention_bias:
            shapes[f"{p}self_attn.{proj}.bias"] = (rows,)
    shapes[p + "self_attn.o_proj.weight"] = (D, H * Dh)
    if output_bias:
        shapes[p + "self_attn.o_proj.bias"] = (D,)
    return shapes


def _bert(task, model_type):
    """BERT, RoBERTa and DistilBERT (hf_bert.py's names): a masked LM, whose decoder weight (and BERT's and RoBERTa's
    decoder bias) is a tied copy, or BERT's classifier with its pooler."""
    b, names = task.backbone, hf_bert.LAYOUT_NAMES[model_type]
    D, F = b.hidden_dim, b.intermediate_dim
    e = names["prefix"] + "embeddings."
    shapes = {e + "word_embeddings.weight": (b.vocabulary_size, D)}
    if b.segment_embedding is not None:
        shapes[e + "token_type_embeddings.weight"] = (b.num_segments, D)
    shapes[e + "position_embeddings.weight"] = tuple(b.position_embedding.embeddings.shape)
    shapes.update(_linear(e + "LayerNorm", D))
    for i in range(b.num_layers):
        p = names["prefix"] + names["layer"].format(i=i)
        for name in ("query", "key", "value", "attention_output"):
            shapes.update(_linear(p + names[name], D, D))
        shapes.update(_linear(p + names["intermediate"], F, D))
        shapes.update(_linear(p + names["output"], D, F))
        for name in ("attention_norm", "output_norm"):
            shapes.update(_linear(p + names[name], D))
    if type(task).__name__ == "BertClassifier":
        shapes.update(_linear(names["prefix"] + "pooler.dense", D, D))
        shapes.update(_linear("classifier", task.num_classes, D))
        return shapes
    shapes.update(_linear(names["head_dense"], D, D))
    shapes.update(_linear(names["head_norm"], D))
    shapes[names["head_bias"]] = (b.vocabulary_size,)
    return shapes


def _linear(name, rows, columns=None):
    """A torch `Linear` (rows, columns) and its bias, or a `LayerNorm` (rows) and its bias."""
    weight = (rows,) if columns is None else (rows, columns)
    return {f"{name}.weight": weight, f"{name}.bias": (rows,)}


def _modernbert(task):
    """ModernBERT's masked LM: fused query/key/value and gated input projections, no biases but the decoder's; the
    first layer has no attention norm (the embedding's norm is its); the decoder weight is a tied copy."""
    b = task.backbone
    D, F = b.hidden_dim, b.intermediate_dim
    shapes = {"model.embeddings.tok_embeddings.weight": (b.vocabulary_size, D), "model.embeddings.norm.weight": (D,)}
    for i in range(b.num_layers):
        p = f"model.layers.{i}."
        if i:
            shapes[p + "attn_norm.weight"] = (D,)
        shapes.update({p + "attn.Wqkv.weight": (3 * D, D), p + "attn.Wo.weight": (D, D), p + "mlp_norm.weight": (D,)})
        shapes.update({p + "mlp.Wi.weight": (2 * F, D), p + "mlp.Wo.weight": (D, F)})
    shapes.update({"model.final_norm.weight": (D,), "head.dense.weight": (D, D), "head.norm.weight": (D,)})
    shapes["decoder.bias"] = (b.vocabulary_size,)
    return shapes


def _t5(task):
    """T5: the shared embedding, a relative attention bias in each stack's first block, gated (wi_0, wi_1) or plain
    (wi) feed-forwards, and an LM head of its own unless tied (T5 v1.0)."""
    b = task.backbone
    D, F, H = b.hidden_dim, b.intermediate_dim, b.num_heads
    inner = H * (b.key_dim or D // H)
    inputs = ("wi_0", "wi_1") if b.activation.startswith("gated-") else ("wi",)  # gated: (activated, linear)
    shapes = {"shared.weight": (b.vocabulary_size, D)}
    for stack, depth in (("encoder", b.num_layers), ("decoder", b.num_decoder_layers or b.num_layers)):
        for i in range(depth):
            p = f"{stack}.block.{i}.layer."
            attentions = ("0.SelfAttention", "1.EncDecAttention") if stack == "decoder" else ("0.SelfAttention",)
            for attention in attentions:
                shapes.update({f"{p}{attention}.{name}.weight": (inner, D) for name in "qkv"})
                shapes[f"{p}{attention}.o.weight"] = (D, inner)
                if i == 0 and attention == "0.SelfAttention":
                    shapes[f"{p}{attention}.relative_attention_bias.weight"] = (b.relative_attention_num_buckets, H)
                shapes[f"{p}{attention[0]}.layer_norm.weight"] = (D,)
            ffn = f"{p}{len(attentions)}."
            shapes.update({f"{ffn}DenseReluDense.{name}.weight": (F, D) for name in inputs})
            shapes.update({f"{ffn}DenseReluDense.wo.weight": (D, F), f"{ffn}layer_norm.weight": (D,)})
        shapes[f"{stack}.final_layer_norm.weight"] = (D,)
    if not b.tie_embedding_weights:
        shapes["lm_head.weight"] = (b.vocabulary_size, D)
    return shapes


def parameter_count(shapes):
    """The number of parameters the table stores (a tied copy counted once, as `transformers` counts them)."""
    return sum(int(np.prod(shape, dtype=np.int64)) for shape in shapes.values())


__all__ = ["checkpoint_shapes", "parameter_count"]
