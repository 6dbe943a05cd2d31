"""GPTCausalLMPreprocessor: strings -> (token ids, padding mask) inputs, next-token labels."""

import numpy as np

from keras_transformer import presets
from keras_transformer.models.input_checks import weigh
from keras_transformer.models.preprocessor import Preprocessor


@presets.register_preprocessor
class GPTCausalLMPreprocessor(Preprocessor):
    """Tokenize, add start/end tokens, pad, and shift by one for next-token prediction.

    Args:
        tokenizer: a `BytePairTokenizer` (any `Tokenizer` with a pad token works).
        sequence_length: int, the model's input length T (labels are the same
            tokens shifted by one).
        add_start_token: bool, prepend the BOS token.
        add_end_token: bool, append the EOS token.
        truncate: bool, cut texts longer than the sequence length. Off by
            default: a too-long text is a ValueError, never silently cut.

    Call arguments:
        x: a string or a list of strings.
        sample_weight: None, (B,) per-example or (B, T) per-token weights, multiplied with the
            padding mask.

    Returns:
        `({"token_ids": (B, T) int32, "padding_mask": (B, T) bool}, labels (B, T) int32, sample_weight (B, T) float32)`.
    """

    def __init__(self, tokenizer, sequence_length=128, add_start_token=True, add_end_token=True, truncate=False):
        super().__init__(tokenizer, sequence_length)
        self.add_start_token = add_start_token
        self.add_end_token = add_end_token
        self.truncate = truncate

    def get_config(self):
        return {
            **super().get_config(),
            "add_start_token": self.add_start_token,
            "add_end_token": self.add_end_token,
            "truncate": self.truncate,
        }

    def __call__(self, x, y=None, sample_weight=None, predict=False):
        if y is not None:
            raise ValueError("A causal LM learns from the text itself: pass only `x` (the strings), not `y`.")
        sequences = [self._wrap(ids) for ids in self.tokenize_texts(x)]
        if self.truncate:
            sequences = [s[: self.sequence_length + 1] for s in sequences]
        ids, mask = self.pad(sequences, self.sequence_length + 1)
        inputs = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}
        if predict:
            return inputs, None, None
        return inputs, ids[:, 1:], weigh(mask[:, 1:].astype("float32"), sample_weight)

    def _wrap(self, ids):
        bos = [self.tokenizer.bos_token_id] if self.add_start_token else []
        eos = [self.tokenizer.eos_token_id] if self.add_end_token else []
        return bos + list(ids) + eos

    def generate_preprocess(self, x):
        """Prompts -> list of id lists (start token added, no end token)."""
        bos = [self.tokenizer.bos_token_id] if self.add_start_token else []
        return [bos + list(ids) for ids in self.tokenize_texts(x, name="prompts")]

    def generate_postprocess(self, ids):
        """Id lists -> strings (special tokens dropped)."""
        return [self.tokenizer.detokenize(np.asarray(row)) for row in ids]
