"""Transformer layers: attention, positions, feed-forward and the encoder/decoder blocks."""

from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.kv_cache import KVCache
from keras_transformer.layers.mixture_of_experts import MixtureOfExperts
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.positional_embedding import PositionalEmbedding
from keras_transformer.layers.relative_position_bias import RelativePositionBias
from keras_transformer.layers.rotary_embedding import RotaryEmbedding
from keras_transformer.layers.router_losses import RouterLosses
from keras_transformer.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_transformer.layers.transformer_encoder_block import TransformerEncoderBlock

__all__ = [
    "FeedForward",
    "KVCache",
    "MixtureOfExperts",
    "MultiHeadAttention",
    "PositionalEmbedding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "RouterLosses",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
