"""GPTCausalLMPreprocessor: strings -> (token ids, padding mask) inputs, next-token labels."""

import numpy as np

from keras_transformer import presets
from keras_transformer.models.input_checks import weigh
from keras_transformer.models.packing import pack_documents
from keras_transformer.models.preprocessor import Preprocessor


@presets.register_preprocessor
class GPTCausalLMPreprocessor(Preprocessor):
    """Tokenize, add start/end tokens, pad, and shift by one for next-token prediction.

    Each text is one row by default, and a text longer than the window is a ValueError. For
    training on documents of any length, `packing=True` concatenates the texts (each framed by
    its start and end tokens) and cuts the stream into windows of `sequence_length + 1` ids
    that overlap by one id, so every token is trained on once (see
    `keras_transformer.models.packing.pack_documents`); a batch of B texts then gives however
    many rows its tokens fill. When the start and end tokens are the same id (GPT-2's
    `<|endoftext|>`), one such token separates two documents. `predict` and `generate` never
    pack: they keep one row per text.

    Args:
        tokenizer: a `BytePairTokenizer` (any `Tokenizer` with a pad token works).
        sequence_length: int, the model's input length T (labels are the same
            tokens shifted by one).
        add_start_token: bool, prepend the BOS token.
        add_end_token: bool, append the EOS token.
        truncate: bool, cut texts longer than the sequence length (what follows the first
            window is lost). Off by default: a too-long text is a ValueError, never silently cut.
        packing: bool, pack the texts into full windows for training and evaluation (above).
            Not with `truncate`.

    Call arguments:
        x: a string or a list of strings.
        sample_weight: None, (B,) per-example or (B, T) per-token weights, multiplied with the
            padding mask. With packing: None or (B,), each token weighted by its text's weight.

    Returns:
        `({"token_ids": (B, T) int32, "padding_mask": (B, T) bool}, labels (B, T) int32, sample_weight (B, T) float32)`;
        with packing, N rows instead of B.

    Example:
    >>> from keras_transformer.corpus import stdlib_texts
    >>> from keras_transformer.tokenizers import BytePairTokenizer
    >>> texts = stdlib_texts("train", max_chars=20_000)  # whole source files
    >>> tokenizer = BytePairTokenizer.train(texts, vocabulary_size=1000)
    >>> preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=128, packing=True)
    >>> x, y, w = preprocessor(texts)
    >>> x["token_ids"].shape  # (N, 128): every token of every file, in windows
    (..., 128)
    """

    def __init__(
        self, tokenizer, sequence_length=128, add_start_token=True, add_end_token=True, truncate=False, packing=False
    ):
        super().__init__(tokenizer, sequence_length)
        if truncate and packing:
            raise ValueError(
                "`truncate` and `packing` exclude each other: packing trains on every token, truncation "
                "drops what does not fit. Received: truncate=True, packing=True"
            )
        self.add_start_token = add_start_token
        self.add_end_token = add_end_token
        self.truncate = truncate
        self.packing = packing

    def get_config(self):
        return {
            **super().get_config(),
            "add_start_token": self.add_start_token,
            "add_end_token": self.add_end_token,
            "truncate": self.truncate,
            "packing": self.packing,
        }

    def __call__(self, x, y=None, sample_weight=None, predict=False):
        if y is not None:
            raise ValueError("A causal LM learns from the text itself: pass only `x` (the strings), not `y`.")
        if self.packing and not predict:
            return self._pack(x, sample_weight)
        sequences = [self._wrap(ids) for ids in self.tokenize_texts(x)]
        if self.truncate:
            sequences = [s[: self.sequence_length + 1] for s in sequences]
        ids, mask = self.pad(sequences, self.sequence_length + 1)
        inputs = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}
        if predict:
            return inputs, None, None
        return inputs, ids[:, 1:], weigh(mask[:, 1:].astype("float32"), sample_weight)

    def _pack(self, x, sample_weight):
        documents = [self._wrap(ids) for ids in self.tokenize_texts(x)]
        if self.add_start_token and self.add_end_token and self.tokenizer.bos_token_id == self.tokenizer.eos_token_id:
            documents = documents[:1] + [document[1:] for document in documents[1:]]  # one separator, not two
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype="float32")
            if sample_weight.ndim != 1:
                raise ValueError(
                    "With packing=True, `sample_weight` holds one weight per text (windows mix texts, so "
                    f"per-token weights cannot follow them). Received: shape={sample_weight.shape}"
                )
            weigh(np.ones((len(documents), 1), "float32"), sample_weight)  # checks the count and NaNs
        return pack_documents(documents, self.sequence_length, self.tokenizer.pad_token_id, sample_weight)

    def check_length(self, sequence, length):
        if len(sequence) > length:
            raise ValueError(
                f"A sequence of {len(sequence)} tokens is longer than `sequence_length`={length - 1} allows "
                f"({length} ids with the shifted labels). To train on whole documents of any length, build the "
                "preprocessor with packing=True (texts concatenated and cut into windows, every token trained "
                "on once); or pass truncate=True to keep only each text's first window, or use a larger "
                "sequence_length."
            )

    def _wrap(self, ids):
        return self._start() + list(ids) + self._end()

    def _start(self):
        """[BOS] when asked for and the tokenizer has one (Qwen2's has none), else []."""
        bos = self.tokenizer.bos_token_id
        return [bos] if self.add_start_token and bos is not None else []

    def _end(self):
        eos = self.tokenizer.eos_token_id
        return [eos] if self.add_end_token and eos is not None else []

    def generate_preprocess(self, x):
        """Prompts -> list of id lists (start token added, no end token)."""
        return [self._start() + list(ids) for ids in self.tokenize_texts(x, name="prompts")]

    def generate_postprocess(self, ids):
        """Id lists -> strings (special tokens dropped)."""
        return [self.tokenizer.detokenize(np.asarray(row)) for row in ids]
