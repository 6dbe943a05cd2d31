"""GemmaCausalLMPreprocessor: strings -> (token ids, padding mask) inputs, next-token labels."""

from keras_transformer import presets
from keras_transformer.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor


@presets.register_preprocessor
class GemmaCausalLMPreprocessor(GPTCausalLMPreprocessor):
    """The causal-LM preprocessing of `GPTCausalLMPreprocessor` for Gemma: a prompt starts with `<bos>`, the
    end token (`<eos>`) ends training texts, padding uses the tokenizer's `<pad>`.

    Args: as `GPTCausalLMPreprocessor`.

    Example:
    >>> from keras_transformer.tokenizers import BytePairTokenizer
    >>> tokenizer = BytePairTokenizer.train(["def f(x):\\n    return x\\n"] * 10, vocabulary_size=300)
    >>> preprocessor = GemmaCausalLMPreprocessor(tokenizer, sequence_length=16)
    >>> x, y, w = preprocessor(["def f(x):"])
    >>> x["token_ids"].shape, y.shape, w.shape
    ((1, 16), (1, 16), (1, 16))
    """
