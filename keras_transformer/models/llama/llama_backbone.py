"""Llama-style decoder-only backbone: rotary positions, grouped-query attention, RMS norm, SwiGLU.

The layout of Llama 2/3, Qwen2, Qwen3, Mistral, SmolLM2 and SmolLM3: token embedding (no learned
positions), pre-norm decoder blocks whose self-attention rotates queries and keys (RoPE), a gated
SiLU feed-forward, RMS norms, a final RMS norm. Per-layer options: a window on some layers only
(`layer_types`), layers without rotary positions (`rope_layers`, SmolLM3's NoPE layers); and RMS
norms of the queries and keys (`query_key_norm`, Qwen3); sparse mixture-of-experts feed-forwards
(`mixture_of_experts`, on the layers `moe_layers` names: Mixtral, Qwen3-MoE, OLMoE).

Axes: B batch, T sequence length, L layers, S_max cache length, Hkv key/value heads,
Dh head size, D model width, V vocabulary.
"""

import keras

from keras_transformer.layers import TransformerDecoderBlock
from keras_transformer.layers.kv_cache import layer_cache_of, like_cache
from keras_transformer.layers.router_losses import RouterLosses, check_coefficients
from keras_transformer.models.backbone import Backbone, call_layer, check_layer_list, check_positive_ints

LAYER_TYPES = ("full_attention", "sliding_attention")
# The constructor's arguments that make the config, in its order (`get_config` writes them all).
CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "num_key_value_heads",
    "head_dim",
    "max_sequence_length",
    "rope_max_wavelength",
    "rope_scaling",
    "rotary_dim",
    "attention_bias",
    "attention_output_bias",
    "mlp_bias",
    "sliding_window",
    "layer_types",
    "rope_layers",
    "query_key_norm",
    "mixture_of_experts",
    "moe_layers",
    "router_aux_loss_coef",
    "router_z_loss_coef",
    "tie_word_embeddings",
    "norm_epsilon",
    "dropout",
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LlamaBackbone(Backbone):
    """Token embedding, `num_layers` causal pre-norm RoPE decoder blocks, a final RMS norm.

    Args:
        vocabulary_size: int, V.
        num_layers: int, L.
        num_heads: int, query heads H.
        hidden_dim: int, D.
        intermediate_dim: int, the SwiGLU width.
        num_key_value_heads: int, key/value heads (grouped-query attention). Defaults to H.
        head_dim: int, Dh. Defaults to D // H.
        max_sequence_length: int, the longest sequence the model is used with (RoPE has no
            table; this bounds the preprocessor and generation).
        rope_max_wavelength: float, RoPE's base (`rope_theta`).
        rope_scaling: None or a Hugging Face `rope_scaling` dict ("linear" or "llama3"),
            see `RotaryEmbedding`.
        rotary_dim: int, rotate only the first dims of each head (partial rotary). Defaults to Dh.
        attention_bias: bool, biases on the query/key/value projections (Qwen2: True).
        attention_output_bias: bool, a bias on the attention output. Defaults to `attention_bias`
            (Llama's `attention_bias` covers all four; Qwen2 has none here).
        mlp_bias: bool, biases in the feed-forward.
        sliding_window: int or None, attention sees only this many positions up to its own (Mistral).
        layer_types: None (every layer as `sliding_window` says) or a list of L entries, each
            "full_attention" or "sliding_attention" (windowed by `sliding_window`), as Hugging Face's
            `layer_types`.
        rope_layers: None (every layer rotates) or a list of L bools, False for a layer whose attention
            has no rotary positions (SmolLM3's `no_rope_layers`, where 0 marks such a layer).
        query_key_norm: None, "head" or "full": RMS norms of the queries and keys before the rotation,
            per head (Qwen3) or over all heads; see `MultiHeadAttention`.
        mixture_of_experts: None, or a dict of `MixtureOfExperts` arguments (num_experts, top_k,
            intermediate_dim, normalize_top_k, ...): the feed-forward of the layers `moe_layers` names is that
            sparse mixture of experts instead of one SwiGLU of `intermediate_dim`.
        moe_layers: None (every layer, with `mixture_of_experts`) or a list of L bools, True for a layer
            whose feed-forward is the mixture of experts (Qwen3-MoE's `decoder_sparse_step` / `mlp_only_layers`).
        router_aux_loss_coef: float >= 0, with `mixture_of_experts`: `fit` adds this times the load-balancing loss
            (transformers' `load_balancing_loss_func` over every MoE layer's router logits, padding left out) to
            the task's loss. 0 (the default) adds nothing, as transformers adds its `router_aux_loss_coef` only
            when `output_router_logits` is set: a converted checkpoint carries its coefficient here only then.
        router_z_loss_coef: float >= 0, with `mixture_of_experts`: `fit` adds this times the router z-loss
            (ST-MoE: the mean over tokens of logsumexp(router logits)^2). 0 adds nothing.
        tie_word_embeddings: bool, the output head is the transposed token embedding.
        norm_epsilon: float, the RMS norms' epsilon.
        dropout: float, dropout on attention and sub-layer outputs.

    Inputs: {"token_ids": (B, T) int, "padding_mask": (B, T) bool}.
    Outputs: hidden states (B, T, D).

    With `mixture_of_experts`, the functional graph ends in a `RouterLosses` layer (`router_losses`) fed with every
    MoE layer's router logits: in training it adds the router losses (`self.losses`, summed into `fit`'s loss on
    every backend; `evaluate`'s loss is the task's alone) and writes each layer's expert load, which the
    `keras_transformer.models.ExpertLoad` callback puts into `fit`'s logs. Outside training it passes the hidden
    states through; `call_with_cache` (generation) does not run it.

    Example:
    >>> import numpy as np
    >>> backbone = LlamaBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                          intermediate_dim=32, num_key_value_heads=1)
    >>> keras.ops.shape(backbone({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), bool)}))
    (1, 4, 16)
    """

    family = "llama"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        num_key_value_heads=None,
        head_dim=None,
        max_sequence_length=2048,
        rope_max_wavelength=10000.0,
        rope_scaling=None,
        rotary_dim=None,
        attention_bias=False,
        attention_output_bias=None,
        mlp_bias=False,
        sliding_window=None,
        layer_types=None,
        rope_layers=None,
        query_key_norm=None,
        mixture_of_experts=None,
        moe_layers=None,
        router_aux_loss_coef=0.0,
        router_z_loss_coef=0.0,
        tie_word_embeddings=True,
        norm_epsilon=1e-6,
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        config = {name: value for name, value in locals().items() if name in CONFIG}  # before any other local
        check_positive_ints(**{name: config[name] for name in CONFIG[:5]}, max_sequence_length=max_sequence_length)
        config["layer_types"] = check_layer_list("layer_types", layer_types, num_layers, LAYER_TYPES)
        rope_layers = check_layer_list("rope_layers", rope_layers, num_layers, (True, False))
        config["rope_layers"] = None if rope_layers is None else [bool(rotates) for rotates in rope_layers]
        if moe_layers is not None and mixture_of_experts is None:
            raise ValueError(
                "`moe_layers` names the layers of the mixture of experts: it needs `mixture_of_experts`. "
                f"Received: moe_layers={moe_layers!r}, mixture_of_experts=None"
            )
        check_coefficients(router_aux_loss_coef=router_aux_loss_coef, router_z_loss_coef=router_z_loss_coef)
        if mixture_of_experts is None and (router_aux_loss_coef or router_z_loss_coef):
            raise ValueError(
                "The router losses need `mixture_of_experts`. Received: "
                f"router_aux_loss_coef={router_aux_loss_coef!r}, router_z_loss_coef={router_z_loss_coef!r}"
            )
        moe_layers = check_layer_list("moe_layers", moe_layers, num_layers, (True, False))
        config["moe_layers"] = None if moe_layers is None else [bool(sparse) for sparse in moe_layers]
        config["mixture_of_experts"] = None if mixture_of_experts is None else dict(mixture_of_experts)
        # === Layers ===
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=tie_word_embeddings,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            dtype=dtype,
            name="token_embedding",
        )
        self.transformer_layers = _decoder_blocks(config, dtype)
        self.layer_norm = keras.layers.RMSNormalization(epsilon=norm_epsilon, dtype=dtype, name="layer_norm")
        self.router_losses = _router_losses(config, dtype)

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
        x = self.token_embedding(token_ids)  # (B, T) -> (B, T, D)
        router_logits = []  # (B * T, E) per MoE layer
        for block in self.transformer_layers:
            if block.mixture_of_experts is None:
                x = block(x, padding_mask=padding_mask)
            else:
                x, logits = block(x, padding_mask=padding_mask, return_router_logits=True)
                router_logits.append(logits)
        outputs = self.layer_norm(x)
        if self.router_losses is not None:  # in training: the router losses and the experts' load
            outputs = self.router_losses(outputs, router_logits, padding_mask)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=outputs, dtype=dtype, **kwargs
        )

        # === Config ===
        for name, value in config.items():  # every argument in CONFIG, as checked above
            setattr(self, name, value)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in CONFIG})
        return config

    # --- cached decoding --------------------------------------------------

    def cache_shape(self, batch_size, max_length):
        """Shape of the key/value cache: (B, L, 2, Hkv, S_max, Dh)."""
        heads = self.num_key_value_heads or self.num_heads
        return (batch_size, self.num_layers, 2, heads, max_length, self.head_dim or self.hidden_dim // self.num_heads)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, call_layer=call_layer):
        """Run T new tokens at positions [cache_index, cache_index + T), reading and writing the cache.

        token_ids: (B, T). cache: (B, L, 2, Hkv, S_max, Dh), or a list of L per-layer (keys, values) pairs.
        padding_mask: (B, S_max) key mask or None. call_layer: how the layers are called
        (see `backbone.call_layer`). The blocks rotate queries and keys at their absolute positions.
        Returns (hidden (B, T, D), updated cache in the form it came).
        """
        x = call_layer(self.token_embedding, token_ids)  # (B, T, D)
        layer_caches = []
        for i, block in enumerate(self.transformer_layers):
            x, layer_cache = call_layer(
                block,
                x,
                padding_mask=padding_mask,
                self_attention_cache=layer_cache_of(cache, i),
                cache_index=cache_index,
            )
            layer_caches.append(layer_cache)
        return call_layer(self.layer_norm, x), like_cache(layer_caches, cache)


# --- constructor helpers --------------------------------------------------


def _router_losses(config, dtype):
    """The `RouterLosses` layer over the MoE layers' router logits, or None without a mixture of experts."""
    experts = config["mixture_of_experts"]
    if experts is None:
        return None
    moe_layers = config["moe_layers"]
    return RouterLosses(
        num_experts=experts["num_experts"],
        top_k=experts["top_k"],
        num_moe_layers=config["num_layers"] if moe_layers is None else sum(moe_layers),
        router_aux_loss_coef=config["router_aux_loss_coef"],
        router_z_loss_coef=config["router_z_loss_coef"],
        dtype=dtype,
        name="router_losses",
    )


def _decoder_blocks(config, dtype):
    """Llama's blocks, `transformer_layer_{i}`: causal, pre-norm RMS norms, SwiGLU, N(0, 0.02) kernels; layer i
    windowed unless `layer_types[i]` is "full_attention", rotating unless `rope_layers[i]` is False, its
    feed-forward the mixture of experts (when there is one) unless `moe_layers[i]` is False."""
    rotary = {
        "max_wavelength": config["rope_max_wavelength"],
        "rotary_dim": config["rotary_dim"],
        "scaling": config["rope_scaling"],
    }
    layer_types, rope_layers, moe_layers = config["layer_types"], config["rope_layers"], config["moe_layers"]
    blocks = []
    for i in range(config["num_layers"]):
        full = layer_types is not None and layer_types[i] == "full_attention"
        rotates = rope_layers is None or rope_layers[i]
        sparse = moe_layers is None or moe_layers[i]
        blocks.append(
            TransformerDecoderBlock(
                config["num_heads"],
                config["intermediate_dim"],
                activation="gated-silu",
                norm_type="rms_norm",
                norm_first=True,
                norm_epsilon=config["norm_epsilon"],
                dropout=config["dropout"],
                use_bias=config["mlp_bias"],
                key_dim=config["head_dim"],
                num_key_value_heads=config["num_key_value_heads"],
                attention_bias=config["attention_bias"],
                attention_output_bias=config["attention_output_bias"],
                rotary_embedding=rotary if rotates else None,
                sliding_window=None if full else config["sliding_window"],
                query_key_norm=config["query_key_norm"],
                mixture_of_experts=config["mixture_of_experts"] if sparse else None,
                kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
                dtype=dtype,
                name=f"transformer_layer_{i}",
            )
        )
    return blocks
