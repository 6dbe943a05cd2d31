"""Transformer decoder block: causal self-attention, optional cross-attention, feed-forward.

Axes: B batch, T query length, S_self self-attention key length (the cache
size when caching), S_enc encoder length, D model width, H heads, Hkv key/value
heads, Dh head size.
"""

import keras

from keras_transformer.layers.transformer_block import TransformerBlock, combine_masks


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderBlock(TransformerBlock):
    """One decoder layer: masked self-attention, cross-attention over the encoder, feed-forward.

    Without cross-attention this is the GPT block. Caches pass through so a
    decoding loop can feed one token per step: the self-attention cache is a
    static (B, 2, Hkv, S_max, Dh) tensor written at `cache_index`; the
    cross-attention cache holds the encoder's projected keys/values, computed
    once.

    Args:
        use_cross_attention: bool, add the cross-attention sub-layer.
        (other arguments as `TransformerEncoderBlock`.)

    Call arguments:
        inputs: (B, T, D) decoder stream.
        encoder_outputs: (B, S_enc, D), needed for cross-attention unless
            `cross_attention_cache` is given.
        padding_mask: (B, S_self) self-attention key mask.
        encoder_padding_mask: (B, S_enc) cross-attention key mask.
        self_attention_bias / cross_attention_bias: additive biases.
        self_attention_cache: (B, 2, Hkv, S_max, Dh), or a (keys, values) pair of
            (B, Hkv, S_max, Dh); with `cache_index`. Returned in the form it came.
        cache_index: int or scalar tensor, position of the first input token.
        cross_attention_cache: (B, 2, Hkv, S_enc, Dh), a (keys, values) pair of
            (B, Hkv, S_enc, Dh), or None.
        use_causal_mask: bool, True for decoders.
        return_attention_scores: bool, also return the self-attention
            probabilities (B, H, T, S_self) (and cross (B, H, T, S_enc)).
        return_router_logits: bool (a block with `mixture_of_experts` only), also return
            the feed-forward router's logits (B * T, E) float32.
        training: bool.

    Returns:
        (B, T, D). With a self-attention cache: `(outputs, self_cache)`, plus
        `cross_cache` when `use_cross_attention`. With
        `return_attention_scores`, a dict of scores is appended, then with
        `return_router_logits` the router's logits.

    Example:
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=32, norm_first=True)
    >>> keras.ops.shape(block(keras.random.normal((2, 4, 16))))
    (2, 4, 16)
    """

    _post_norms = True

    def __init__(self, num_heads, intermediate_dim, use_cross_attention=False, **kwargs):
        super().__init__(num_heads, intermediate_dim, **kwargs)
        self.use_cross_attention = use_cross_attention
        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        if self.post_norm:
            self.self_attention_post_norm = self._norm("self_attention_post_norm")
        if use_cross_attention:
            if self.post_norm:
                raise ValueError("`post_norm` is implemented for self-attention blocks only. Received: post_norm=True")
            self.cross_attention = self._attention("cross_attention")
            self.cross_attention_norm = self._norm("cross_attention_norm")

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self.self_attention.build(inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        if self.post_norm:
            self.self_attention_post_norm.build(inputs_shape)
            self.feed_forward_post_norm.build(inputs_shape)
        if self.use_cross_attention:
            encoder_outputs_shape = encoder_outputs_shape or inputs_shape
            self.cross_attention.build(inputs_shape, encoder_outputs_shape)
            self.cross_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        self_attention_bias=None,
        cross_attention_bias=None,
        self_attention_cache=None,
        cache_index=None,
        cross_attention_cache=None,
        use_causal_mask=True,
        return_attention_scores=False,
        return_router_logits=False,
        training=None,
    ):
        if self.use_cross_attention and encoder_outputs is None and cross_attention_cache is None:
            raise ValueError("This block has cross-attention: pass `encoder_outputs` or `cross_attention_cache`.")
        if self_attention_cache is not None and cache_index is None:
            raise ValueError("`cache_index` is required with `self_attention_cache`.")
        scores = {}
        x = inputs
        h = self.self_attention(
            self._pre(x, self.self_attention_norm),
            attention_mask=combine_masks(padding_mask, None),
            attention_bias=self_attention_bias,
            use_causal_mask=use_causal_mask,
            cache=self_attention_cache,
            cache_index=cache_index,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        h, self_attention_cache, scores["self_attention"] = _unpack(
            h, self_attention_cache is not None, return_attention_scores
        )
        x = self._post(x, h, self.self_attention_norm, training, getattr(self, "self_attention_post_norm", None))

        if self.use_cross_attention:
            caching = self_attention_cache is not None
            if caching and cross_attention_cache is None:
                cross_attention_cache = self.cross_attention.compute_cache(encoder_outputs)
            h = self.cross_attention(
                self._pre(x, self.cross_attention_norm),
                value=encoder_outputs,
                attention_mask=encoder_padding_mask,
                attention_bias=cross_attention_bias,
                cache=cross_attention_cache,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            h, _, scores["cross_attention"] = _unpack(h, cross_attention_cache is not None, return_attention_scores)
            x = self._post(x, h, self.cross_attention_norm, training)

        x = self._feed_forward_sublayer(x, training, return_router_logits)
        if return_router_logits:
            x, router_logits = x

        outputs = (x,)
        if self_attention_cache is not None:
            outputs += (self_attention_cache,)
            if self.use_cross_attention:
                outputs += (cross_attention_cache,)
        if return_attention_scores:
            outputs += (scores,)
        if return_router_logits:
            outputs += (router_logits,)
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        config = super().get_config()
        config["use_cross_attention"] = self.use_cross_attention
        return config


def _unpack(result, has_cache, has_scores):
    """MultiHeadAttention's result -> (output, cache or None, scores or None)."""
    if not has_cache and not has_scores:
        return result, None, None
    output, *rest = result
    scores = rest.pop(0) if has_scores else None
    cache = rest.pop(0) if has_cache else None
    return output, cache, scores
