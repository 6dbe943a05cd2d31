from keras_transformer.models.modernbert.modernbert_backbone import ModernBertBackbone
from keras_transformer.models.modernbert.modernbert_encoder_block import ModernBertEncoderBlock
from keras_transformer.models.modernbert.modernbert_masked_lm import ModernBertMaskedLM
from keras_transformer.models.modernbert.modernbert_masked_lm_preprocessor import ModernBertMaskedLMPreprocessor
from keras_transformer.models.modernbert.modernbert_text_embedder import ModernBertTextEmbedder

__all__ = [
    "ModernBertBackbone",
    "ModernBertEncoderBlock",
    "ModernBertMaskedLM",
    "ModernBertMaskedLMPreprocessor",
    "ModernBertTextEmbedder",
]
