"""TextEmbedderPreprocessor: texts -> ids with the special tokens of the tokenizer's own template, right-padded.

Axes: B batch, T sequence length.
"""

import numpy as np

from keras_transformer import presets
from keras_transformer.models.preprocessor import Preprocessor, as_string_list

__all__ = ["TextEmbedderPreprocessor"]


@presets.register_preprocessor
class TextEmbedderPreprocessor(Preprocessor):
    """Each text framed by the special tokens its tokenizer's template adds, as sentence-transformers tokenizes.

    The template is the tokenizer.json's post-processor, which `transformers`' `tokenizer(texts)` applies:
    Qwen3-Embedding's appends `<|endoftext|>` (the token its last-token pooling reads), ModernBERT's writes
    `[CLS] text [SEP]`, a Llama 3 tokenizer's prepends `<|begin_of_text|>`. A tokenizer without one (those
    trained here) adds nothing. Rows are right-padded; the poolings read the padding mask, so left padding (which
    Qwen3-Embedding's tokenizer asks for) gives the same embeddings.

    Args:
        tokenizer: a `Tokenizer` with a padding token.
        sequence_length: int, T.
        truncate: bool, cut too-long texts to fit with their special tokens (as sentence-transformers does at its
            max_seq_length). Off by default: a too-long text is a ValueError, never silently cut.

    Call arguments:
        x: a string or a list of strings.
        y: None, or anything with one entry per text (passed through: a contrastive loss ignores it).
        sample_weight: None, or one weight per text.
        predict: bool, return only the inputs.

    Returns:
        `({"token_ids": (B, T) int32, "padding_mask": (B, T) bool}, y, sample_weight)`.

    Example:
    >>> from keras_transformer.tokenizers import BytePairTokenizer
    >>> tokenizer = BytePairTokenizer.train(["def f(x):\\n    return x\\n"] * 10, vocabulary_size=300)
    >>> x, _, _ = TextEmbedderPreprocessor(tokenizer, sequence_length=8)(["def f(x):"], predict=True)
    >>> x["token_ids"].shape, x["padding_mask"].dtype
    ((1, 8), dtype('bool'))
    """

    def __init__(self, tokenizer, sequence_length=128, truncate=False):
        super().__init__(tokenizer, sequence_length)
        if tokenizer.pad_token_id is None:
            raise ValueError("The tokenizer has no pad token, which a batch of texts needs. Received: pad_token=None")
        if not isinstance(truncate, bool):
            raise ValueError(f"`truncate` must be a bool. Received: truncate={truncate!r}")
        self.truncate = truncate

    def get_config(self):
        return {**super().get_config(), "truncate": self.truncate}

    def __call__(self, x, y=None, sample_weight=None, predict=False):
        texts = as_string_list(x)
        token_ids, padding_mask = self.pad(self.with_special_tokens(texts))
        inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
        if predict:
            return inputs, None, None
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype="float32").reshape(-1)
            if sample_weight.shape[0] != len(texts):
                raise ValueError(
                    f"Got {sample_weight.shape[0]} sample weights for {len(texts)} texts: pass one per text."
                )
        return inputs, (None if y is None else np.asarray(y)), sample_weight

    def with_special_tokens(self, texts):
        """list[str] -> list of id lists, each with its template's special tokens (cut first when `truncate`)."""
        backend = self.tokenizer.backend_tokenizer
        encodings = backend.encode_batch(list(texts), add_special_tokens=False)
        if self.truncate:
            added = backend.post_processor.num_special_tokens_to_add(False) if backend.post_processor else 0
            for encoding in encodings:
                encoding.truncate(max(self.sequence_length - added, 0))
        return [backend.post_process(encoding).ids for encoding in encodings]
