"""Transformer encoder block: self-attention and feed-forward sub-layers.

Axes: B batch, T sequence length, D model width, H heads.
"""

import keras

from keras_transformer.layers.transformer_block import TransformerBlock, combine_masks


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoderBlock(TransformerBlock):
    """One encoder layer: bidirectional self-attention, then a feed-forward network.

    Each sub-layer has a residual connection and a norm, post-norm as in the
    paper and BERT (`norm_first=False`) or pre-norm as in GPT-2 and T5.

    Args:
        num_heads: int, attention heads.
        intermediate_dim: int, feed-forward inner width.
        activation: feed-forward activation (see `FeedForward`).
        dropout: float in [0, 1), on attention probabilities and sub-layer outputs.
        norm_type: "layer_norm" or "rms_norm".
        norm_first: bool, pre-norm when True.
        norm_epsilon: float, epsilon of the norms.
        use_bias: bool, biases in the projections.
        key_dim: int, head size (default D // num_heads).
        num_key_value_heads: int, grouped-query key/value heads.
        attention_scale: float, logit scale (default 1 / sqrt(key_dim)).
        kernel_initializer: initializer of the kernels.

    Call arguments:
        inputs: (B, T, D).
        padding_mask: (B, T), True for real tokens.
        attention_mask: (B, T, T), True where attending is allowed.
        attention_bias: additive, broadcastable to (B, H, T, T).
        return_attention_scores: bool, also return (B, H, T, T) probabilities.
        training: bool.

    Returns:
        (B, T, D), or `(outputs, scores)`.

    Example:
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=32)
    >>> keras.ops.shape(block(keras.random.normal((2, 4, 16))))
    (2, 4, 16)
    """

    def __init__(self, num_heads, intermediate_dim, **kwargs):
        super().__init__(num_heads, intermediate_dim, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")

    def build(self, inputs_shape):
        self.self_attention.build(inputs_shape)
        self.self_attention_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        attention_bias=None,
        return_attention_scores=False,
        training=None,
    ):
        x = inputs
        h = self.self_attention(
            self._pre(x, self.self_attention_norm),
            attention_mask=combine_masks(padding_mask, attention_mask),
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        if return_attention_scores:
            h, scores = h
        x = self._post(x, h, self.self_attention_norm, training)
        x = self._feed_forward_sublayer(x, training)
        return (x, scores) if return_attention_scores else x
