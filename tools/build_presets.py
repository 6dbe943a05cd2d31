"""Write the preset zoo in models/: one folder per preset with config.json, tokenizer and model card.

Tokenizers are trained on the Python standard library's source (offline). Untrained presets ship no
weights (they start from random initialisation); trained presets are written by the recipes in
tools/train_*.py, which add model.weights.h5 and metrics to the card.

    KERAS_BACKEND=jax python tools/build_presets.py            # all presets
    KERAS_BACKEND=jax python tools/build_presets.py gpt_tiny   # some
"""

import json
import math
import sys
from pathlib import Path

from keras_transformer.corpus import stdlib_texts

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "models"

GPT_TINY = dict(
    vocabulary_size=8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=512
)
GPT_SMALL = dict(
    vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072, max_sequence_length=1024
)
GPT_MEDIUM = dict(
    vocabulary_size=50257, num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096, max_sequence_length=1024
)
BERT_TINY = dict(
    vocabulary_size=8000, num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=512, max_sequence_length=512
)
BERT_SMALL = dict(
    vocabulary_size=30522, num_layers=4, num_heads=8, hidden_dim=512, intermediate_dim=2048, max_sequence_length=512
)
BERT_BASE = dict(
    vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072, max_sequence_length=512
)
DISTILBERT_BASE = dict(BERT_BASE, num_layers=6, num_segments=0)
ROBERTA_BASE = dict(BERT_BASE, vocabulary_size=50265, num_segments=1, norm_epsilon=1e-5, position_offset=2)
XLM_ROBERTA_BASE = dict(ROBERTA_BASE, vocabulary_size=250002)
MINILM_L6 = dict(BERT_BASE, num_layers=6, hidden_dim=384, intermediate_dim=1536)
BGE_SMALL = dict(BERT_BASE, hidden_dim=384, intermediate_dim=1536)
MODERNBERT_BASE = dict(
    vocabulary_size=50368,
    num_layers=22,
    num_heads=12,
    hidden_dim=768,
    intermediate_dim=1152,
    max_sequence_length=8192,
    local_attention=128,
    global_rope_max_wavelength=160000.0,
    local_rope_max_wavelength=10000.0,
)
T5_TINY = dict(vocabulary_size=8000, num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=512, key_dim=32)
T5_SMALL = dict(vocabulary_size=32128, num_layers=6, num_heads=8, hidden_dim=512, intermediate_dim=2048, key_dim=64)
T5_BASE = dict(vocabulary_size=32128, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072, key_dim=64)
LLAMA_TINY = dict(
    vocabulary_size=8000,
    num_layers=4,
    num_heads=4,
    num_key_value_heads=2,
    hidden_dim=256,
    intermediate_dim=768,
    max_sequence_length=1024,
)
SMOLLM2_135M = dict(
    vocabulary_size=49152,
    num_layers=30,
    num_heads=9,
    num_key_value_heads=3,
    hidden_dim=576,
    intermediate_dim=1536,
    max_sequence_length=8192,
    rope_max_wavelength=100000.0,
    norm_epsilon=1e-5,
)
QWEN2_0_5B = dict(
    vocabulary_size=151936,
    num_layers=24,
    num_heads=14,
    num_key_value_heads=2,
    hidden_dim=896,
    intermediate_dim=4864,
    max_sequence_length=32768,
    rope_max_wavelength=1000000.0,
    attention_bias=True,
    attention_output_bias=False,
    norm_epsilon=1e-6,
)
QWEN3_0_6B = dict(
    vocabulary_size=151936,
    num_layers=28,
    num_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    hidden_dim=1024,
    intermediate_dim=3072,
    max_sequence_length=40960,
    rope_max_wavelength=1000000.0,
    query_key_norm="head",
    tie_word_embeddings=True,
    norm_epsilon=1e-6,
)
SMOLLM3_3B = dict(
    vocabulary_size=128256,
    num_layers=36,
    num_heads=16,
    num_key_value_heads=4,
    hidden_dim=2048,
    intermediate_dim=11008,
    max_sequence_length=65536,
    rope_max_wavelength=5000000.0,
    rope_layers=[(i + 1) % 4 != 0 for i in range(36)],  # every fourth layer without rotary positions (NoPE)
    tie_word_embeddings=True,
    norm_epsilon=1e-6,
)
# Phi-4-mini-instruct's longrope factors (config.json's rope_scaling): the long ones past 4096 positions.
PHI4_MINI_LONG_FACTOR = [
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6,
    32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
]  # fmt: skip
PHI4_MINI = dict(
    vocabulary_size=200064,
    num_layers=32,
    num_heads=24,
    num_key_value_heads=8,
    head_dim=128,
    hidden_dim=3072,
    intermediate_dim=8192,
    max_sequence_length=131072,
    rope_max_wavelength=10000.0,
    rotary_dim=96,  # partial_rotary_factor 0.75
    rope_scaling={
        "rope_type": "longrope",
        "short_factor": [1.0] * 48,
        "long_factor": PHI4_MINI_LONG_FACTOR,
        "original_max_position_embeddings": 4096,
        # transformers' default: sqrt(1 + ln(131072 / 4096) / ln(4096))
        "attention_factor": math.sqrt(1 + math.log(131072 / 4096) / math.log(4096)),
    },
    sliding_window=262144,
    tie_word_embeddings=True,
    norm_epsilon=1e-5,
)
# The mixture-of-experts shapes, from their published config.json (tests/convert/test_hf_moe.py holds them).
QWEN3_30B_A3B = dict(
    vocabulary_size=151936,
    num_layers=48,
    num_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    hidden_dim=2048,
    intermediate_dim=6144,
    max_sequence_length=40960,
    rope_max_wavelength=1000000.0,
    query_key_norm="head",
    mixture_of_experts={"num_experts": 128, "top_k": 8, "intermediate_dim": 768, "normalize_top_k": True},
    attention_output_bias=False,
    tie_word_embeddings=False,
    norm_epsilon=1e-6,
)
MIXTRAL_8X7B = dict(
    vocabulary_size=32000,
    num_layers=32,
    num_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    hidden_dim=4096,
    intermediate_dim=14336,
    max_sequence_length=32768,
    rope_max_wavelength=1000000.0,
    mixture_of_experts={"num_experts": 8, "top_k": 2, "intermediate_dim": 14336, "normalize_top_k": True},
    attention_output_bias=False,
    tie_word_embeddings=False,
    norm_epsilon=1e-5,
)
OLMOE_1B_7B = dict(
    vocabulary_size=50304,
    num_layers=16,
    num_heads=16,
    num_key_value_heads=16,
    head_dim=128,
    hidden_dim=2048,
    intermediate_dim=1024,
    max_sequence_length=4096,
    rope_max_wavelength=10000.0,
    query_key_norm="full",
    mixture_of_experts={"num_experts": 64, "top_k": 8, "intermediate_dim": 1024, "normalize_top_k": False},
    attention_output_bias=False,
    tie_word_embeddings=False,
    norm_epsilon=1e-5,
)
GEMMA3_1B = dict(
    vocabulary_size=262144,
    num_layers=26,
    num_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    hidden_dim=1152,
    intermediate_dim=6912,
    max_sequence_length=32768,
    query_pre_attn_scalar=256.0,
    rope_max_wavelength=1000000.0,
    local_rope_max_wavelength=10000.0,
    sliding_window=512,
    # every sixth layer global, the others local (sliding_window_pattern 6)
    layer_types=["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(26)],
    query_key_norm="head",
    tie_word_embeddings=True,
    norm_epsilon=1e-6,
)
TRANSFORMER_BASE = dict(
    vocabulary_size=37000, num_layers=6, num_heads=8, hidden_dim=512, intermediate_dim=2048, max_sequence_length=512
)

# name: (family, tokenizer class, backbone class, backbone config, task class, preprocessor class, preprocessor config,
# description)
PRESETS = {
    "gpt_tiny": (
        "gpt",
        "BytePairTokenizer",
        "GPTBackbone",
        GPT_TINY,
        "GPTCausalLM",
        "GPTCausalLMPreprocessor",
        {"sequence_length": 128},
        "GPT-style decoder, 4 layers, d 256, 4 heads, byte-level BPE 8k.",
    ),
    "gpt_small": (
        "gpt",
        "BytePairTokenizer",
        "GPTBackbone",
        GPT_SMALL,
        "GPTCausalLM",
        "GPTCausalLMPreprocessor",
        {"sequence_length": 1024},
        "GPT-2 small shape (124M): 12 layers, d 768, 12 heads, BPE 50257.",
    ),
    "gpt_medium": (
        "gpt",
        "BytePairTokenizer",
        "GPTBackbone",
        GPT_MEDIUM,
        "GPTCausalLM",
        "GPTCausalLMPreprocessor",
        {"sequence_length": 1024},
        "GPT-2 medium shape (355M): 24 layers, d 1024, 16 heads, BPE 50257.",
    ),
    "llama_tiny": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        LLAMA_TINY,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 128},
        "Llama-style decoder, 4 layers, d 256, 4 heads (2 key/value), SwiGLU 768, RoPE, byte-level BPE 8k.",
    ),
    "smollm2_135m": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        SMOLLM2_135M,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "SmolLM2-135M shape: 30 layers, d 576, 9 heads (3 key/value), SwiGLU 1536, rope_theta 1e5, "
        "tied head, BPE 49152.",
    ),
    "qwen2_0_5b": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        QWEN2_0_5B,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "Qwen2.5-0.5B shape: 24 layers, d 896, 14 heads (2 key/value), SwiGLU 4864, q/k/v biases, "
        "rope_theta 1e6, tied head, 151936 embedding rows (the tokenizer here has 49152).",
    ),
    "qwen3_0_6b": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        QWEN3_0_6B,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "Qwen3-0.6B shape (the real checkpoint: hf://Qwen/Qwen3-0.6B): 28 layers, d 1024, 16 heads (8 key/value) "
        "of 128, RMS-normed queries and keys per head, SwiGLU 3072, rope_theta 1e6, tied head, 151936 embedding "
        "rows (the tokenizer here has 49152).",
    ),
    "smollm3_3b": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        SMOLLM3_3B,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "SmolLM3-3B shape (the real checkpoint: hf://HuggingFaceTB/SmolLM3-3B): 36 layers, d 2048, 16 heads "
        "(4 key/value), every fourth layer without rotary positions (NoPE), SwiGLU 11008, rope_theta 5e6, tied "
        "head, 128256 embedding rows (the tokenizer here has 49152).",
    ),
    "phi4_mini": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        PHI4_MINI,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "Phi-4-mini shape (the real checkpoint: hf://microsoft/Phi-4-mini-instruct): 32 layers, d 3072, 24 heads "
        "(8 key/value) of 128, three quarters of each head rotating (96 dims), longrope scaling past 4096 positions "
        "(131072 in all), SwiGLU 8192, tied head, 200064 embedding rows (the tokenizer here has 49152).",
    ),
    "qwen3_30b_a3b": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        QWEN3_30B_A3B,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "Qwen3-30B-A3B shape (the real checkpoint: hf://Qwen/Qwen3-30B-A3B): 48 layers, d 2048, 32 heads (4 "
        "key/value) of 128, RMS-normed queries and keys per head, a mixture of 128 SwiGLU experts of 768 on every "
        "layer, 8 per token (renormalised), rope_theta 1e6, untied head, 151936 embedding rows (the tokenizer here "
        "has 49152).",
    ),
    "mixtral_8x7b": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        MIXTRAL_8X7B,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "Mixtral-8x7B shape (the real checkpoint: hf://mistralai/Mixtral-8x7B-v0.1): 32 layers, d 4096, 32 heads (8 "
        "key/value) of 128, a mixture of 8 SwiGLU experts of 14336 on every layer, 2 per token (renormalised), "
        "rope_theta 1e6, no sliding window, untied head, 32000 embedding rows (the tokenizer here has 8000).",
    ),
    "olmoe_1b_7b": (
        "llama",
        "BytePairTokenizer",
        "LlamaBackbone",
        OLMOE_1B_7B,
        "LlamaCausalLM",
        "LlamaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "OLMoE-1B-7B shape (the real checkpoint: hf://allenai/OLMoE-1B-7B-0924): 16 layers, d 2048, 16 heads of 128, "
        "RMS-normed queries and keys over all heads, a mixture of 64 SwiGLU experts of 1024 on every layer, 8 per "
        "token (not renormalised), untied head, 50304 embedding rows (the tokenizer here has 49152).",
    ),
    "gemma3_1b": (
        "gemma",
        "BytePairTokenizer",
        "GemmaBackbone",
        GEMMA3_1B,
        "GemmaCausalLM",
        "GemmaCausalLMPreprocessor",
        {"sequence_length": 2048},
        "Gemma 3 1B shape (the real checkpoint: hf://google/gemma-3-1b-it): 26 layers, d 1152, 4 heads (1 key/value) "
        "of 256, five local layers (a 512-token window, rope_theta 1e4) per global one (rope_theta 1e6), (1 + w) RMS "
        "norms before and after attention and the GeGLU 6912, per-head query/key norms, embeddings times sqrt(d), "
        "tied head, 262144 embedding rows (the tokenizer here has 49152).",
    ),
    "bert_tiny": (
        "bert",
        "WordPieceTokenizer",
        "BertBackbone",
        BERT_TINY,
        "BertMaskedLM",
        "BertMaskedLMPreprocessor",
        {"sequence_length": 128},
        "BERT-style encoder, 2 layers, d 128, 2 heads, WordPiece 8k.",
    ),
    "bert_small": (
        "bert",
        "WordPieceTokenizer",
        "BertBackbone",
        BERT_SMALL,
        "BertMaskedLM",
        "BertMaskedLMPreprocessor",
        {"sequence_length": 512},
        "BERT-style encoder, 4 layers, d 512, 8 heads, WordPiece 30522.",
    ),
    "bert_base": (
        "bert",
        "WordPieceTokenizer",
        "BertBackbone",
        BERT_BASE,
        "BertMaskedLM",
        "BertMaskedLMPreprocessor",
        {"sequence_length": 512},
        "BERT-base shape (110M): 12 layers, d 768, 12 heads, WordPiece 30522.",
    ),
    "distilbert_base": (
        "bert",
        "WordPieceTokenizer",
        "BertBackbone",
        DISTILBERT_BASE,
        "BertMaskedLM",
        "BertMaskedLMPreprocessor",
        {"sequence_length": 512},
        "DistilBERT-base shape (66M; the real checkpoint: hf://distilbert/distilbert-base-uncased): 6 layers, "
        "d 768, 12 heads, no token types, WordPiece 30522.",
    ),
    "roberta_base": (
        "bert",
        "BytePairTokenizer",
        "BertBackbone",
        ROBERTA_BASE,
        "BertMaskedLM",
        "BertMaskedLMPreprocessor",
        {"sequence_length": 512},
        "RoBERTa-base shape (125M; the real checkpoint: hf://FacebookAI/roberta-base): 12 layers, d 768, 12 heads, "
        "positions past the padding id, one token type; a byte-level BPE tokenizer in RoBERTa's layout (<s> <pad> "
        "</s> <unk> as ids 0-3, <mask> last, <s> a </s></s> b </s>), 50265 embedding rows (the tokenizer here has "
        "50261).",
    ),
    "xlm_roberta_base": (
        "bert",
        "UnigramTokenizer",
        "BertBackbone",
        XLM_ROBERTA_BASE,
        "BertMaskedLM",
        "BertMaskedLMPreprocessor",
        {"sequence_length": 512},
        "XLM-RoBERTa-base shape (278M; the real checkpoint: hf://FacebookAI/xlm-roberta-base): RoBERTa-base's layers "
        "over 250002 embedding rows; a SentencePiece-style Unigram tokenizer in XLM-R's layout (<s> <pad> </s> <unk> "
        "as ids 0-3, <mask> last; the tokenizer here has 32130 pieces).",
    ),
    "all_minilm_l6_v2": (
        "bert",
        "WordPieceTokenizer",
        "BertBackbone",
        MINILM_L6,
        "BertTextEmbedder",
        "BertTextClassifierPreprocessor",
        {"sequence_length": 256},
        "all-MiniLM-L6-v2 shape (23M; the real checkpoint: hf://sentence-transformers/all-MiniLM-L6-v2): a sentence "
        "embedder, 6 layers, d 384, 12 heads, mean pooling, L2-normalised, 256 tokens, WordPiece 30522.",
    ),
    "bge_small": (
        "bert",
        "WordPieceTokenizer",
        "BertBackbone",
        BGE_SMALL,
        "BertTextEmbedder",
        "BertTextClassifierPreprocessor",
        {"sequence_length": 512},
        "BGE-small-en-v1.5 shape (33M; the real checkpoint: hf://BAAI/bge-small-en-v1.5): a sentence embedder, 12 "
        "layers, d 384, 12 heads, the [CLS] state L2-normalised, WordPiece 30522.",
    ),
    "modernbert_base": (
        "modernbert",
        "BytePairTokenizer",
        "ModernBertBackbone",
        MODERNBERT_BASE,
        "ModernBertMaskedLM",
        "ModernBertMaskedLMPreprocessor",
        {"sequence_length": 512},
        "ModernBERT-base shape (150M; the real checkpoint: hf://answerdotai/ModernBERT-base): 22 layers, d 768, "
        "12 heads, every third layer global (rope_theta 160000) and the others local (a 128-token window, "
        "rope_theta 10000), GeGLU 1152, no biases, tied head; a byte-level BPE tokenizer with [CLS] [SEP] [PAD] "
        "[MASK] [UNK] after its vocabulary as ModernBERT's, 50368 embedding rows (the tokenizer here has 49157).",
    ),
    "t5_tiny": (
        "t5",
        "UnigramTokenizer",
        "T5Backbone",
        T5_TINY,
        "T5Seq2SeqLM",
        "T5Seq2SeqLMPreprocessor",
        {"encoder_sequence_length": 128, "decoder_sequence_length": 128},
        "T5-style encoder-decoder, 2+2 layers, d 128, 4 heads, Unigram 8k.",
    ),
    "t5_small": (
        "t5",
        "UnigramTokenizer",
        "T5Backbone",
        T5_SMALL,
        "T5Seq2SeqLM",
        "T5Seq2SeqLMPreprocessor",
        {"encoder_sequence_length": 512, "decoder_sequence_length": 512},
        "T5-small shape (60M): 6+6 layers, d 512, 8 heads, Unigram 32128.",
    ),
    "t5_base": (
        "t5",
        "UnigramTokenizer",
        "T5Backbone",
        T5_BASE,
        "T5Seq2SeqLM",
        "T5Seq2SeqLMPreprocessor",
        {"encoder_sequence_length": 512, "decoder_sequence_length": 512},
        "T5-base shape (220M): 12+12 layers, d 768, 12 heads, Unigram 32128.",
    ),
    "transformer_base": (
        "transformer",
        "BytePairTokenizer",
        "TransformerBackbone",
        TRANSFORMER_BASE,
        "TransformerSeq2SeqLM",
        "TransformerSeq2SeqLMPreprocessor",
        {"encoder_sequence_length": 256, "decoder_sequence_length": 256},
        "The original Transformer base (Vaswani et al. 2017): 6+6 post-norm layers, d 512, 8 heads, "
        "d_ff 2048, ReLU, sinusoidal positions, shared BPE 37000.",
    ),
}


# Presets whose embedding has more rows than their tokenizer has tokens (as Qwen2's: 151936 rows, 151665 tokens).
TOKENIZER_SIZES = {
    "qwen2_0_5b": 49152,
    "qwen3_0_6b": 49152,
    "gemma3_1b": 49152,
    "phi4_mini": 49152,
    "qwen3_30b_a3b": 49152,
    "mixtral_8x7b": 8000,
    "olmoe_1b_7b": 49152,
    "smollm3_3b": 49152,
    "modernbert_base": 49152,
}
# Presets whose byte-level BPE gets BERT's special tokens after its vocabulary, as ModernBERT's tokenizer has them.
ENCODER_BPE = ("modernbert_base",)
# Presets whose tokenizer is another preset's, in the layout of the real checkpoint's (no training): the source, and
# whether RoBERTa's specials are put around its vocabulary (else it is copied as it is).
DERIVED_TOKENIZERS = {
    "roberta_base": ("gpt_small", True),
    "xlm_roberta_base": ("t5_small", True),
    "all_minilm_l6_v2": ("bert_base", False),
    "bge_small": ("bert_base", False),
}
# The task config of presets whose task has settings (the embedders' pooling, as their sentence-transformers folders).
TASK_CONFIGS = {
    "all_minilm_l6_v2": {"pooling": "mean", "normalize": True},
    "bge_small": {"pooling": "cls", "normalize": True},
}
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def with_roberta_specials(tokenizer):
    """A byte-level BPE or Unigram tokenizer in RoBERTa's and XLM-R's layout: its own special tokens dropped,
    <s> <pad> </s> <unk> as ids 0-3 before its vocabulary, <mask> (which takes the space before it) after it, and
    the post-processor of roberta-base (RobertaProcessing) or xlm-roberta-base (the same template): <s> a </s> and
    <s> a </s></s> b </s>."""
    from tokenizers import AddedToken, Tokenizer, processors

    data = json.loads(tokenizer.backend_tokenizer.to_str())
    own = {token["content"] for token in data["added_tokens"]}
    model, data["added_tokens"] = data["model"], []
    if model["type"] == "BPE":
        pieces = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1]) if token not in own]
        model["vocab"] = {token: i for i, token in enumerate([*ROBERTA_SPECIALS, *pieces])}
    else:  # Unigram: [piece, log probability] rows
        model["vocab"] = [[token, 0.0] for token in ROBERTA_SPECIALS] + [r for r in model["vocab"] if r[0] not in own]
        model["unk_id"] = ROBERTA_SPECIALS.index("<unk>")
    backend = Tokenizer.from_str(json.dumps(data))
    backend.add_special_tokens([AddedToken(token, normalized=False) for token in ROBERTA_SPECIALS])
    backend.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False)])
    if model["type"] == "BPE":
        backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    else:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
    special = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    return type(tokenizer)(backend, cls_token="<s>", sep_token="</s>", **special)


def derived_tokenizer(name):
    from keras_transformer import tokenizers

    source, roberta = DERIVED_TOKENIZERS[name]
    tokenizer = tokenizers.Tokenizer.load(ZOO / source)
    return with_roberta_specials(tokenizer) if roberta else tokenizer


def with_encoder_specials(tokenizer):
    """A BytePairTokenizer with [UNK] [CLS] [SEP] [PAD] [MASK] appended ([MASK] strips the space before it), whose
    post-processor writes [CLS] text [SEP], as ModernBERT's tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, processors

    from keras_transformer.tokenizers import BytePairTokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    names = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    backend.add_special_tokens([AddedToken(name, lstrip=name == "[MASK]", normalized=False) for name in names])
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    special = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    return BytePairTokenizer(backend, bos_token=None, eos_token=None, **special)


def train_tokenizer(class_name, vocabulary_size, cache={}):
    from keras_transformer import tokenizers

    key = (class_name, vocabulary_size)
    if key not in cache:
        print(f"training {class_name} with {vocabulary_size} tokens on the standard library ...", flush=True)
        cache[key] = getattr(tokenizers, class_name).train(stdlib_texts("train"), vocabulary_size)
    return cache[key]


def parameter_count(backbone_class, config):
    """The backbone's parameters, from two small builds of it (one layer and two) where the config has
    `num_layers` (a 3B model is never built: every layer has the same parameters); a mixture of experts (7-47B
    parameters, 0.6-1.5B in one layer) is counted from its config alone (`llama_parameter_counts`)."""
    import keras_transformer as kt

    try:
        cls = getattr(kt.models, backbone_class)
    except AttributeError:
        return None
    if config.get("mixture_of_experts") is not None:
        return llama_parameter_counts(config)[0]
    if "num_layers" not in config or backbone_class.startswith(("T5", "Transformer")):
        return int(cls(**config).count_params())

    def count(layers):
        per_layer = {key: value[:layers] for key, value in config.items() if key in ("layer_types", "rope_layers")}
        return int(cls(**{**config, "num_layers": layers, **per_layer}).count_params())

    one, two = count(1), count(2)
    return one + (config["num_layers"] - 1) * (two - one)


def llama_parameter_counts(config):
    """(all parameters, the parameters one token uses) of a LlamaBackbone config, from the config alone: a token
    runs k of a mixture's E experts (the router, the attention, the norms, a shared expert and the embeddings all).
    Axes: V vocabulary, D width, H heads, Hkv key/value heads, Dh head size, F dense inner width, E experts, k
    experts per token, I one expert's inner width, S the shared expert's inner width."""
    V, D, L, H = config["vocabulary_size"], config["hidden_dim"], config["num_layers"], config["num_heads"]
    Hkv = config.get("num_key_value_heads") or H
    Dh = config.get("head_dim") or D // H
    qkv_bias = bool(config.get("attention_bias", False))
    output_bias = config.get("attention_output_bias")
    output_bias = qkv_bias if output_bias is None else bool(output_bias)
    attention = D * (H + 2 * Hkv) * Dh + H * Dh * D + qkv_bias * (H + 2 * Hkv) * Dh + output_bias * D
    attention += {None: 0, "head": 2 * Dh, "full": (H + Hkv) * Dh}[config.get("query_key_norm")]
    F = config["intermediate_dim"]
    dense = 3 * D * F + bool(config.get("mlp_bias", False)) * (2 * F + D)
    moe = config.get("mixture_of_experts")
    sparse_layers = 0 if moe is None else sum(config.get("moe_layers") or [True] * L)
    total = V * D * (1 if config.get("tie_word_embeddings", True) else 2) + D  # embeddings, final norm
    total += L * (attention + 2 * D) + (L - sparse_layers) * dense
    active = total
    if moe is not None:
        E, k, I = moe["num_experts"], moe["top_k"], moe["intermediate_dim"]
        S = moe.get("shared_intermediate_dim") or 0
        shared = 3 * D * S + (D if moe.get("shared_expert_gate") else 0) + D * E  # and the router
        total += sparse_layers * (shared + 3 * E * D * I)
        active += sparse_layers * (shared + 3 * k * D * I)
    return total, active


def model_card(name, family, description, config, count):
    lines = [
        f"# {name}",
        "",
        description,
        "",
        f"- family: {family}",
        f"- parameters: {count:,}" if count else "- parameters: (computed when the family is installed)",
        *(
            [f"- active parameters per token: {llama_parameter_counts(config)[1]:,} (counted from the config)"]
            if config.get("mixture_of_experts")
            else []
        ),
        "- weights: none shipped; the model starts from random initialisation (train it with `fit`).",
        "- tokenizer: trained on the Python standard library's source files (tools/build_presets.py)"
        + (
            f", as {DERIVED_TOKENIZERS[name][0]}'s, in the real checkpoint's layout."
            if name in DERIVED_TOKENIZERS
            else "."
        ),
        "",
        "## Config",
        "",
        "```json",
        json.dumps(config, indent=2),
        "```",
        "",
    ]
    return "\n".join(lines)


def build(name):
    family, tok_cls, bb_cls, bb_config, task_cls, pre_cls, pre_config, description = PRESETS[name]
    folder = ZOO / name
    folder.mkdir(parents=True, exist_ok=True)
    if name in DERIVED_TOKENIZERS:
        derived_tokenizer(name).save(folder)
    elif not (folder / "tokenizer.json").exists():  # training the 32k Unigram takes minutes: keep existing ones
        tokenizer = train_tokenizer(tok_cls, TOKENIZER_SIZES.get(name, bb_config["vocabulary_size"]))
        (with_encoder_specials(tokenizer) if name in ENCODER_BPE else tokenizer).save(folder)
    count = parameter_count(bb_cls, bb_config)
    config = {
        "name": name,
        "family": family,
        "description": description,
        "parameter_count": count,
        **(
            {"active_parameter_count": llama_parameter_counts(bb_config)[1]}
            if "mixture_of_experts" in bb_config
            else {}
        ),
        "backbone": {"class_name": bb_cls, "config": bb_config},
        "task": {"class_name": task_cls, "config": TASK_CONFIGS.get(name, {})},
        "preprocessor": {"class_name": pre_cls, "config": pre_config},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if not (folder / "model.weights.h5").exists():
        (folder / "README.md").write_text(model_card(name, family, description, bb_config, count))
    print(f"wrote {folder} ({count} parameters)", flush=True)


if __name__ == "__main__":
    for preset in sys.argv[1:] or PRESETS:
        build(preset)
