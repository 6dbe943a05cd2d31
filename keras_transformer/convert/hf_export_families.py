"""The Hugging Face class of each exportable task (hf_export.py): its config class, model class and config
arguments, built from our task's options. Options our model has and the Hugging Face class has not are refused
here, before anything is written; the weights follow from the family's converter (`FAMILIES`).
"""

from keras_transformer.convert import hf_bert, hf_gemma, hf_gpt2, hf_llama, hf_modernbert, hf_moe, hf_phi3, hf_t5
from keras_transformer.convert.options import ACTIVATIONS

# Our activation -> the Hugging Face name the converters read back as it (the first listed wins).
_HF_ACTIVATIONS = {ours: hf_name for hf_name, ours in reversed(list(ACTIVATIONS.items()))}


# --- families ---------------------------------------------------------------
# Each builds (config class name, model class name, config arguments) from a task; the weights follow
# from the family's converter (`FAMILIES`). Options our model has and the Hugging Face class has not
# are refused here, before anything is written.


def gpt_config(task):
    b = task.backbone
    if b.num_key_value_heads not in (None, b.num_heads):
        raise unsupported(task, f"num_key_value_heads={b.num_key_value_heads}", "GPT-2 has no grouped-query attention")
    return (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(
            vocab_size=b.vocabulary_size,
            n_embd=b.hidden_dim,
            n_layer=b.num_layers,
            n_head=b.num_heads,
            n_inner=b.intermediate_dim,
            n_positions=b.max_sequence_length,
            activation_function=hf_activation(task, b.activation),
            layer_norm_epsilon=b.norm_epsilon,
            resid_pdrop=b.dropout,
            embd_pdrop=b.dropout,
            attn_pdrop=b.dropout,
            tie_word_embeddings=True,
        ),
    )


def llama_config(task):
    """Llama, Qwen2, Qwen3, SmolLM3 or Mistral, whichever has exactly this model's options; Phi-3 for partial
    rotary positions or longrope scaling; a mixture of experts as `hf_moe.export_config` says."""
    b = task.backbone
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    if b.rotary_dim not in (None, head_dim) or (b.rope_scaling or {}).get("rope_type") == "longrope":
        return phi3_config(task)
    if b.mixture_of_experts is not None:
        return hf_moe.export_config(task, _decoder_settings(b), lambda option, why: unsupported(task, option, why))
    qkv_bias = bool(b.attention_bias)
    output_bias = qkv_bias if b.attention_output_bias is None else bool(b.attention_output_bias)
    mlp_bias, window = bool(b.mlp_bias), b.sliding_window
    theta = float(b.rope_max_wavelength)
    rope = (
        {"rope_type": "default", "rope_theta": theta} if not b.rope_scaling else {**b.rope_scaling, "rope_theta": theta}
    )
    layer_types = _layer_types(b)
    settings = {**_decoder_settings(b), "head_dim": head_dim, "rope_parameters": rope, "hidden_act": "silu"}
    windows = dict(use_sliding_window=window is not None, sliding_window=window, layer_types=layer_types)
    norm, rope_layers = b.query_key_norm, b.rope_layers
    if norm is not None or rope_layers is not None:
        return _llama_newer(task, settings, windows, qkv_bias, output_bias, mlp_bias)
    if qkv_bias and not output_bias and not mlp_bias:  # Qwen2: query/key/value biases only
        return "Qwen2Config", "Qwen2ForCausalLM", {**settings, **windows, **_max_window_layers(layer_types)}
    if window is None and qkv_bias == output_bias:  # Llama: one switch for all four projections
        return "LlamaConfig", "LlamaForCausalLM", {**settings, "attention_bias": qkv_bias, "mlp_bias": mlp_bias}
    if window is not None and b.layer_types is None and not (qkv_bias or output_bias or mlp_bias):
        return "MistralConfig", "MistralForCausalLM", {**settings, "sliding_window": window}
    raise unsupported(
        task,
        f"attention_bias={b.attention_bias}, attention_output_bias={b.attention_output_bias}, "
        f"mlp_bias={b.mlp_bias}, sliding_window={window}, layer_types={layer_types}",
        "no Hugging Face class has this mix (Llama: biases on all four attention projections or none, mlp_bias, "
        "no window; Qwen2: query/key/value biases, optional window; Mistral: no biases, a window on every layer)",
    )


def _decoder_settings(b):
    """The config entries every rotary decoder's Hugging Face config spells alike (Llama, Qwen, Mistral, Phi-3,
    Gemma), from backbone `b`."""
    return dict(
        vocab_size=b.vocabulary_size,
        hidden_size=b.hidden_dim,
        intermediate_size=b.intermediate_dim,
        num_hidden_layers=b.num_layers,
        num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_key_value_heads or b.num_heads,
        max_position_embeddings=b.max_sequence_length,
        rms_norm_eps=b.norm_epsilon,
        attention_dropout=b.dropout,
        tie_word_embeddings=bool(b.tie_word_embeddings),
    )


def _layer_types(backbone):
    """transformers' `layer_types` of a windowed backbone (every layer "sliding_attention" unless ours says
    which), or None without a window."""
    if backbone.sliding_window is None:
        return None
    return list(backbone.layer_types or ["sliding_attention"] * backbone.num_layers)


def _max_window_layers(layer_types):
    """Qwen's `max_window_layers` (the layers before it are full, those from it windowed) where `layer_types` has
    that form, as a Qwen config that says so would; `layer_types`, written beside it, is what transformers reads."""
    if layer_types is None:
        return {}
    first = layer_types.index("sliding_attention")
    return {"max_window_layers": first} if set(layer_types[first:]) == {"sliding_attention"} else {}


def _llama_newer(task, settings, windows, qkv_bias, output_bias, mlp_bias):
    """Qwen3 (query/key norms per head, `attention_bias` on all four projections) or SmolLM3 (NoPE layers)."""
    b = task.backbone
    if qkv_bias != output_bias:
        raise unsupported(
            task,
            f"attention_bias={b.attention_bias}, attention_output_bias={b.attention_output_bias}",
            "Qwen3 and SmolLM3 have biases on all four attention projections or none",
        )
    if b.query_key_norm is not None:
        if b.query_key_norm != "head" or b.rope_layers is not None or mlp_bias:
            raise unsupported(
                task,
                f"query_key_norm={b.query_key_norm!r}, rope_layers={b.rope_layers}, mlp_bias={b.mlp_bias}",
                "Qwen3 normalises each head's queries and keys, rotates every layer and has no feed-forward biases",
            )
        qwen3 = {**settings, **windows, **_max_window_layers(windows["layer_types"]), "attention_bias": qkv_bias}
        return "Qwen3Config", "Qwen3ForCausalLM", qwen3
    rope_layers = [int(rotates) for rotates in b.rope_layers]
    return (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        {**settings, **windows, "no_rope_layers": rope_layers, "attention_bias": qkv_bias, "mlp_bias": mlp_bias},
    )


def phi3_config(task):
    """Phi3ForCausalLM: no biases, no query/key norms, every layer rotating and windowed alike, whole heads of
    D / H; partial rotary positions as `partial_rotary_factor`, longrope with its original length (the attention
    factor written only where it is not the one transformers derives from the lengths)."""
    b = task.backbone
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    rotary_dim = b.rotary_dim or head_dim
    partial = rotary_dim / head_dim
    mixed = b.attention_bias or b.attention_output_bias or b.mlp_bias or b.query_key_norm or b.rope_layers
    if (
        mixed
        or b.layer_types is not None
        or head_dim * b.num_heads != b.hidden_dim
        or int(head_dim * partial) != rotary_dim
    ):
        raise unsupported(
            task,
            f"rotary_dim={b.rotary_dim}, rope_scaling={b.rope_scaling} with attention_bias={b.attention_bias}, "
            f"mlp_bias={b.mlp_bias}, query_key_norm={b.query_key_norm!r}, rope_layers={b.rope_layers}, "
            f"layer_types={b.layer_types}, head_dim={b.head_dim}",
            "partial rotary positions and longrope are Phi-3's, which has no biases, no query/key norms, one window "
            "for all layers and heads of hidden_dim / num_heads",
        )
    rope = {"rope_type": "default", "rope_theta": float(b.rope_max_wavelength), "partial_rotary_factor": partial}
    settings = {}
    if b.rope_scaling:  # longrope (llama3 and linear scalings have no Phi-3 form)
        if b.rope_scaling["rope_type"] != "longrope":
            raise unsupported(task, f"rope_scaling={b.rope_scaling}", "Phi-3's only rope scaling is longrope")
        original = b.rope_scaling["original_max_position_embeddings"]
        rope.update(  # transformers 5 keeps the original length in the rope parameters and at the top level
            rope_type="longrope",
            short_factor=list(b.rope_scaling["short_factor"]),
            long_factor=list(b.rope_scaling["long_factor"]),
            original_max_position_embeddings=original,
        )
        attention_factor = b.rope_scaling["attention_factor"]
        if attention_factor != hf_phi3.longrope_attention_factor({}, b.max_sequence_length, original):
            rope["attention_factor"] = attention_factor
        settings["original_max_position_embeddings"] = original
    settings.update(
        _decoder_settings(b),
        rope_parameters=rope,
        hidden_act="silu",
        resid_pdrop=b.dropout,
        sliding_window=b.sliding_window,
    )
    return "Phi3Config", "Phi3ForCausalLM", settings


def gemma_config(task):
    """Gemma3ForCausalLM (query/key norms per head) or Gemma2ForCausalLM (none), their rotary bases per layer type
    as transformers 5 names them (hf_export.py adds transformers 4's spelling)."""
    b = task.backbone
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    scalar = b.query_pre_attn_scalar or head_dim
    local = b.local_rope_max_wavelength or b.rope_max_wavelength
    full = {"rope_type": "default", "rope_theta": float(b.rope_max_wavelength)}
    if b.rope_scaling:
        full = {**{k: v for k, v in b.rope_scaling.items()}, "rope_theta": float(b.rope_max_wavelength)}
    settings = dict(
        _decoder_settings(b),
        head_dim=head_dim,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
        # transformers wants a window even where no layer slides.
        sliding_window=b.sliding_window or b.max_sequence_length,
        layer_types=list(b.layer_types or ["full_attention"] * b.num_layers),
        attn_logit_softcapping=b.attention_logit_soft_cap,
        final_logit_softcapping=b.final_logit_soft_cap,
        attention_bias=bool(b.attention_bias),
    )
    if b.query_key_norm == "head":
        rope = {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": float(local)}}
        return "Gemma3TextConfig", "Gemma3ForCausalLM", {**settings, "rope_parameters": rope}
    if b.rope_scaling or local != b.rope_max_wavelength:
        raise unsupported(
            task,
            f"query_key_norm=None with rope_scaling={b.rope_scaling}, local_rope_max_wavelength={local}",
            "Gemma 2 (no query/key norms) has one unscaled rotary embedding for all layers",
        )
    return "Gemma2Config", "Gemma2ForCausalLM", {**settings, "rope_parameters": full}


def bert_config(task):
    b = task.backbone
    if b.num_segments == 0:
        return _distilbert_config(task)
    settings = dict(
        vocab_size=b.vocabulary_size,
        hidden_size=b.hidden_dim,
        num_hidden_layers=b.num_layers,
        num_attention_heads=b.num_heads,
        intermediate_size=b.intermediate_dim,
        max_position_embeddings=b.max_sequence_length,
        type_vocab_size=b.num_segments,
        hidden_act=hf_activation(task, b.activation),
        layer_norm_eps=b.norm_epsilon,
        hidden_dropout_prob=b.dropout,
        attention_probs_dropout_prob=b.dropout,
    )
    if b.position_offset:  # RoBERTa's layout: positions past the padding id, its own masked-LM head
        if type(task).__name__ == "BertClassifier":
            raise unsupported(
                task, f"position_offset={b.position_offset}", "RoBERTa's classification head is not BERT's pooler"
            )
        settings.update(max_position_embeddings=b.max_sequence_length + b.position_offset)
        return "RobertaConfig", "RobertaForMaskedLM", settings
    if type(task).__name__ == "BertClassifier":
        settings.update(num_labels=task.num_classes, classifier_dropout=task.dropout)
        return "BertConfig", "BertForSequenceClassification", settings
    return "BertConfig", "BertForMaskedLM", settings


def _distilbert_config(task):
    """A BertBackbone without segments: DistilBERT's layout (its LayerNorm epsilon fixed, no position offset)."""
    b = task.backbone
    if (
        type(task).__name__ == "BertClassifier"
        or b.position_offset
        or b.norm_epsilon != hf_bert.DISTILBERT_NORM_EPSILON
    ):
        raise unsupported(
            task,
            f"num_segments=0 with position_offset={b.position_offset}, norm_epsilon={b.norm_epsilon}",
            "a backbone without segments is DistilBERT's masked LM, whose positions start at 0 and whose LayerNorm "
            f"epsilon is {hf_bert.DISTILBERT_NORM_EPSILON} (its classification head is not BERT's pooler)",
        )
    settings = dict(
        vocab_size=b.vocabulary_size,
        dim=b.hidden_dim,
        n_layers=b.num_layers,
        n_heads=b.num_heads,
        hidden_dim=b.intermediate_dim,
        max_position_embeddings=b.max_sequence_length,
        activation=hf_activation(task, b.activation),
        dropout=b.dropout,
        attention_dropout=b.dropout,
        sinusoidal_pos_embds=False,
        tie_weights_=True,
    )
    return "DistilBertConfig", "DistilBertForMaskedLM", settings


def modernbert_config(task):
    """ModernBertForMaskedLM; its rotary bases per layer type, its window and activation as transformers 5 names them
    (hf_export.py adds the Hub's spelling for transformers 4)."""
    b = task.backbone
    activations = {ours: hf_name for hf_name, ours in reversed(list(hf_modernbert.GATED_ACTIVATIONS.items()))}
    if b.activation not in activations:
        raise unsupported(task, f"activation={b.activation!r}", f"ModernBERT names only {sorted(activations)}")
    settings = dict(
        vocab_size=b.vocabulary_size,
        hidden_size=b.hidden_dim,
        intermediate_size=b.intermediate_dim,
        num_hidden_layers=b.num_layers,
        num_attention_heads=b.num_heads,
        hidden_activation=activations[b.activation],
        max_position_embeddings=b.max_sequence_length,
        norm_eps=b.norm_epsilon,
        local_attention=b.local_attention,
        layer_types=[b.layer_type(i) for i in range(b.num_layers)],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": float(b.global_rope_max_wavelength)},
            "sliding_attention": {"rope_type": "default", "rope_theta": float(b.local_rope_max_wavelength)},
        },
        embedding_dropout=b.dropout,
        attention_dropout=b.dropout,
        mlp_dropout=b.dropout,
        initializer_range=b.initializer_range,
        tie_word_embeddings=True,
    )
    tokenizer = task.preprocessor.tokenizer if task.preprocessor is not None else None
    settings.update(
        cls_token_id=tokenizer.cls_token_id if tokenizer else None,
        sep_token_id=tokenizer.sep_token_id if tokenizer else None,
    )
    return "ModernBertConfig", "ModernBertForMaskedLM", settings


def t5_config(task):
    b = task.backbone
    activation = b.activation
    if activation.startswith("gated-"):
        proj = "gated-" + hf_activation(task, activation.removeprefix("gated-"))
    else:
        proj = hf_activation(task, activation)
    return (
        "T5Config",
        "T5ForConditionalGeneration",
        dict(
            vocab_size=b.vocabulary_size,
            d_model=b.hidden_dim,
            d_kv=b.key_dim or b.hidden_dim // b.num_heads,
            d_ff=b.intermediate_dim,
            num_layers=b.num_layers,
            num_decoder_layers=b.num_decoder_layers or b.num_layers,
            num_heads=b.num_heads,
            relative_attention_num_buckets=b.relative_attention_num_buckets,
            relative_attention_max_distance=b.relative_attention_max_distance,
            dropout_rate=b.dropout,
            layer_norm_epsilon=b.norm_epsilon,
            feed_forward_proj=proj,
            n_positions=b.max_sequence_length,
            # transformers reads tie_word_embeddings=False as T5 v1.1's unscaled head of its own.
            tie_word_embeddings=bool(b.tie_embedding_weights),
            is_encoder_decoder=True,
        ),
    )


# Exported model types whose tensors another converter than the task family's names (Phi-3's fused projections).
LAYOUT_CONVERTERS = {"phi3": hf_phi3, **dict.fromkeys(hf_moe.MODEL_TYPES, hf_moe)}

# Task class -> (config builder, converter module).
FAMILIES = {
    "GPTCausalLM": (gpt_config, hf_gpt2),
    "LlamaCausalLM": (llama_config, hf_llama),
    "GemmaCausalLM": (gemma_config, hf_gemma),
    "BertMaskedLM": (bert_config, hf_bert),
    "BertClassifier": (bert_config, hf_bert),
    "ModernBertMaskedLM": (modernbert_config, hf_modernbert),
    "T5Seq2SeqLM": (t5_config, hf_t5),
}


_SUPPORTED = (
    f"format='huggingface' exports the tasks {sorted(FAMILIES)} (GPT as GPT2LMHeadModel; Llama, Qwen2, Qwen3, "
    "SmolLM3, Mistral and Phi-3 layouts, and the mixtures of experts Qwen3-MoE, Mixtral, OLMoE and Qwen2-MoE; "
    "Gemma 3 text and Gemma 2; "
    "BERT masked LM and classifier, RoBERTa, XLM-R, DistilBERT and ModernBERT masked "
    "LMs; T5)"
)


def family_of(task):
    name = type(task).__name__
    if name not in FAMILIES:
        raise ValueError(
            f"No Hugging Face class for a {name}: {_SUPPORTED}. Received: task of type {name}. Nothing was written."
        )
    return FAMILIES[name][0]


def unsupported(task, option, why):
    return ValueError(
        f"Cannot export this {type(task).__name__} to the Hugging Face format: {option} ({why}); {_SUPPORTED}. "
        "Nothing was written."
    )


def hf_activation(task, ours):
    if ours not in _HF_ACTIVATIONS:
        raise unsupported(task, f"activation={ours!r}", f"Hugging Face names only {sorted(_HF_ACTIVATIONS)}")
    return _HF_ACTIVATIONS[ours]
