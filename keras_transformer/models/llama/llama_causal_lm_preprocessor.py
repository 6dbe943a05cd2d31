"""LlamaCausalLMPreprocessor: strings -> (token ids, padding mask) inputs, next-token labels."""

from keras_transformer import presets
from keras_transformer.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor


@presets.register_preprocessor
class LlamaCausalLMPreprocessor(GPTCausalLMPreprocessor):
    """The causal-LM preprocessing of `GPTCausalLMPreprocessor` with Llama's defaults.

    A prompt starts with the BOS token (`<|begin_of_text|>`, `<s>`); the EOS token ends
    training texts. A tokenizer without a BOS token (Qwen2) gets none (`add_start_token` is
    ignored there), as Hugging Face's tokenizers do.

    Args: as `GPTCausalLMPreprocessor`.

    Example:
    >>> from keras_transformer.tokenizers import BytePairTokenizer
    >>> tokenizer = BytePairTokenizer.train(["def f(x):\\n    return x\\n"] * 10, vocabulary_size=300)
    >>> preprocessor = LlamaCausalLMPreprocessor(tokenizer, sequence_length=16)
    >>> x, y, w = preprocessor(["def f(x):"])
    >>> x["token_ids"].shape, y.shape, w.shape
    ((1, 16), (1, 16), (1, 16))
    """
