"""The residual sub-layer machinery shared by the encoder and decoder blocks (private).

Axes: B batch, T sequence length, D model width.
"""

import keras
from keras import ops

from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.mixture_of_experts import MixtureOfExperts
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.rms_normalization import rms_norm

# "rms_norm_plus_one": RMS norms that scale by (1 + w), the query/key norms too (Gemma).
NORM_TYPES = ("layer_norm", "rms_norm", "rms_norm_plus_one")


class TransformerBlock(keras.layers.Layer):
    """Base of the encoder and decoder blocks: arguments, sub-layer factories, residual rule.

    Post-norm (the paper, BERT): x = Norm(x + Dropout(Sublayer(x))).
    Pre-norm (GPT-2, T5):        x = x + Dropout(Sublayer(Norm(x))).

    `use_bias` covers every projection; `attention_bias` / `attention_output_bias`
    override it for the attention's query/key/value and output projections (Llama's
    `attention_bias`, Qwen2's biased q/k/v with an unbiased output). `rotary_embedding`
    (a `RotaryEmbedding` config dict), `sliding_window` and `query_key_norm` (None, "head" or "full": an RMS
    norm of the queries and keys, with the block's `norm_epsilon`) apply to self-attention, and so does
    `attention_logit_soft_cap` (see `MultiHeadAttention`'s `logit_soft_cap`). `post_norm` (pre-norm blocks
    only) adds a norm of each sub-layer's output before the residual sum (Gemma 2 and 3):
    x = x + Dropout(Norm_post(Sublayer(Norm(x)))).
    `mixture_of_experts` (None, or a dict of `MixtureOfExperts` arguments) makes the feed-forward sub-layer a
    sparse mixture of experts (Mixtral, Qwen3-MoE, OLMoE) instead of one `FeedForward` of `intermediate_dim`.
    """

    _post_norms = False  # whether the block implements `post_norm` (the decoder block does)

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        norm_type="layer_norm",
        norm_first=False,
        norm_epsilon=1e-5,
        use_bias=True,
        key_dim=None,
        num_key_value_heads=None,
        attention_scale=None,
        kernel_initializer="glorot_uniform",
        attention_bias=None,
        attention_output_bias=None,
        rotary_embedding=None,
        sliding_window=None,
        query_key_norm=None,
        post_norm=False,
        attention_logit_soft_cap=None,
        mixture_of_experts=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if norm_type not in NORM_TYPES:
            raise ValueError(f"`norm_type` must be one of {NORM_TYPES}. Received: norm_type={norm_type!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        if post_norm and not self._post_norms:
            raise ValueError(f"`post_norm` is not implemented by {type(self).__name__}. Received: post_norm=True")
        if post_norm and not norm_first:
            raise ValueError(
                "`post_norm` adds norms to pre-norm blocks: it needs norm_first=True. Received: post_norm=True"
            )
        if norm_epsilon <= 0:
            raise ValueError(f"`norm_epsilon` must be positive. Received: norm_epsilon={norm_epsilon}")
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.dropout = dropout
        self.norm_type = norm_type
        self.norm_first = norm_first
        self.norm_epsilon = norm_epsilon
        self.use_bias = use_bias
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self.attention_scale = attention_scale
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.attention_bias = attention_bias
        self.attention_output_bias = attention_output_bias
        self.rotary_embedding = rotary_embedding
        self.sliding_window = sliding_window
        self.query_key_norm = query_key_norm
        self.post_norm = post_norm
        self.attention_logit_soft_cap = attention_logit_soft_cap
        self.mixture_of_experts = None if mixture_of_experts is None else dict(mixture_of_experts)
        # Sub-layers are created here so that bad arguments fail eagerly.
        self._attention_kwargs = dict(
            num_heads=num_heads,
            key_dim=key_dim,
            num_key_value_heads=num_key_value_heads,
            use_bias=use_bias if attention_bias is None else attention_bias,
            output_bias=attention_output_bias,
            dropout=dropout,
            scale=attention_scale,
            kernel_initializer=kernel_initializer,
            dtype=self.dtype_policy,
        )
        if mixture_of_experts is None:
            self.feed_forward = FeedForward(
                intermediate_dim,
                activation=activation,
                use_bias=use_bias,
                kernel_initializer=kernel_initializer,
                dtype=self.dtype_policy,
                name="feed_forward",
            )
        else:
            self.feed_forward = _mixture_of_experts(mixture_of_experts, kernel_initializer, self.dtype_policy)
        self.feed_forward_norm = self._norm("feed_forward_norm")
        if post_norm:
            self.feed_forward_post_norm = self._norm("feed_forward_post_norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def _attention(self, name):
        """Self-attention gets the rotary embedding and the sliding window; cross-attention neither."""
        kwargs = dict(self._attention_kwargs)
        if name == "self_attention":
            kwargs.update(
                rotary_embedding=self.rotary_embedding,
                sliding_window=self.sliding_window,
                query_key_norm=self.query_key_norm,
                query_key_norm_epsilon=self.norm_epsilon,
                query_key_norm_scale_offset=1.0 if self.norm_type == "rms_norm_plus_one" else 0.0,
                logit_soft_cap=self.attention_logit_soft_cap,
            )
        return MultiHeadAttention(name=name, **kwargs)

    def _norm(self, name):
        if self.norm_type != "layer_norm":
            offset = 1.0 if self.norm_type == "rms_norm_plus_one" else 0.0
            return rms_norm(self.norm_epsilon, offset, dtype=self.dtype_policy, name=name)
        return keras.layers.LayerNormalization(epsilon=self.norm_epsilon, dtype=self.dtype_policy, name=name)

    def _pre(self, x, norm):
        """The sub-layer's input: normalised first in pre-norm blocks."""
        return ops.cast(norm(x), self.compute_dtype) if self.norm_first else x

    def _post(self, residual, output, norm, training, post_norm=None):
        """Residual connection (of the output through `post_norm` when the block has those), then the norm in
        post-norm blocks."""
        if post_norm is not None:
            output = ops.cast(post_norm(output), self.compute_dtype)
        x = residual + self.dropout_layer(output, training=training)
        return x if self.norm_first else ops.cast(norm(x), self.compute_dtype)

    def _feed_forward_sublayer(self, x, training, return_router_logits=False):
        """The feed-forward sub-layer's output; with `return_router_logits` (mixtures of experts only), also the
        router's logits (B * T, E)."""
        if return_router_logits and self.mixture_of_experts is None:
            raise ValueError(
                f"`return_router_logits` needs a mixture-of-experts feed-forward; {self.name!r} has a dense one. "
                "Received: return_router_logits=True"
            )
        inputs = self._pre(x, self.feed_forward_norm)
        if return_router_logits:
            h, router_logits = self.feed_forward(inputs, return_router_logits=True, training=training)
        else:
            h, router_logits = self.feed_forward(inputs, training=training), None
        post_norm = self.feed_forward_post_norm if self.post_norm else None
        x = self._post(x, h, self.feed_forward_norm, training, post_norm)
        return (x, router_logits) if return_router_logits else x

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def compute_output_spec(self, inputs, *args, return_router_logits=False, **kwargs):
        # `compute_output_shape` gives the hidden states only; a functional graph that asks for the router's
        # logits (a backbone's router losses) gets them appended, with the mixture of experts' own spec.
        outputs = super().compute_output_spec(inputs, *args, **kwargs)
        if not return_router_logits:
            return outputs
        _, router_logits = self.feed_forward.compute_output_spec(inputs, return_router_logits=True)
        return (*outputs, router_logits) if isinstance(outputs, tuple) else (outputs, router_logits)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "dropout": self.dropout,
                "norm_type": self.norm_type,
                "norm_first": self.norm_first,
                "norm_epsilon": self.norm_epsilon,
                "use_bias": self.use_bias,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "attention_scale": self.attention_scale,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "attention_bias": self.attention_bias,
                "attention_output_bias": self.attention_output_bias,
                "rotary_embedding": self.rotary_embedding,
                "sliding_window": self.sliding_window,
                "query_key_norm": self.query_key_norm,
                "post_norm": self.post_norm,
                "attention_logit_soft_cap": self.attention_logit_soft_cap,
                "mixture_of_experts": self.mixture_of_experts,
            }
        )
        return config


def _mixture_of_experts(options, kernel_initializer, dtype_policy):
    """The `MixtureOfExperts` of a block's `mixture_of_experts` dict; an argument the layer lacks is an error."""
    if not isinstance(options, dict):
        raise ValueError(
            "`mixture_of_experts` must be None or a dict of `MixtureOfExperts` arguments. "
            f"Received: mixture_of_experts={options!r}"
        )
    known = ("num_experts", "top_k", "intermediate_dim", "activation", "normalize_top_k", "shared_intermediate_dim")
    known += ("shared_expert_gate",)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"`mixture_of_experts` takes the keys {known}. Received: mixture_of_experts with {unknown}")
    return MixtureOfExperts(**options, kernel_initializer=kernel_initializer, dtype=dtype_policy, name="feed_forward")


def combine_masks(padding_mask, attention_mask):
    """(B, S) key mask and (B, T, S) mask -> one mask for MultiHeadAttention, or None."""
    if padding_mask is None:
        return attention_mask
    if attention_mask is None:
        return padding_mask
    # (B, S) -> (B, 1, S), broadcast against (B, T, S)
    return ops.logical_and(ops.cast(attention_mask, "bool"), ops.cast(padding_mask, "bool")[:, None, :])
