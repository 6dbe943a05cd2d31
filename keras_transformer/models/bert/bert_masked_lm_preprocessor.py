"""BertMaskedLMPreprocessor: strings -> packed BERT inputs with hidden tokens, and the ids to predict.

Axes: B batch, T sequence length, P selections per sequence (max_selections).
"""

import numbers

import numpy as np

from keras_transformer import presets
from keras_transformer.models.bert.bert_packing import pack_bert_inputs
from keras_transformer.models.preprocessor import Preprocessor


@presets.register_preprocessor
class BertMaskedLMPreprocessor(Preprocessor):
    """Pack `[CLS] text [SEP]`, pick tokens to predict and hide them, as in BERT pre-training.

    For each text, `max(1, round(mask_selection_rate * n))` of its n ordinary
    tokens are selected at random (never `[CLS]`, `[SEP]`, padding or any other
    special token such as `[UNK]`; at most `max_selections`), exactly as the
    original `create_pretraining_data.py`. Each selected token is then replaced
    by `[MASK]` with probability `mask_token_rate`, by a random ordinary token
    with probability `random_token_rate`, and otherwise left unchanged. The
    model sees the changed ids and learns the original ones at the selected
    positions.

    The draws come from a numpy Generator seeded with `seed`: two
    preprocessors with the same seed give the same batches, and each call
    draws new masks. (`Task.fit` on a list of strings preprocesses the list
    once, so those masks stay fixed over epochs; pass a `keras.utils.PyDataset`
    of strings for new masks every epoch.)

    Args:
        tokenizer: a `WordPieceTokenizer` (any `Tokenizer` with `[CLS]`, `[SEP]`,
            `[MASK]` and padding tokens).
        sequence_length: int, T.
        mask_selection_rate: float in (0, 1], the share of tokens to predict.
        mask_token_rate: float in [0, 1], the share of selections shown as `[MASK]`.
        random_token_rate: float in [0, 1], the share shown as a random token
            (`mask_token_rate + random_token_rate <= 1`; the rest stay unchanged).
        max_selections: int, P, the number of prediction slots per sequence
            (default `round(mask_selection_rate * sequence_length)`).
        seed: int or None, seed of the numpy random generator.
        truncate: bool, cut texts longer than `sequence_length - 2` tokens.
            Off by default: a too-long text is a ValueError, never silently cut.

    Call arguments:
        x: a string or a list of strings.
        predict: bool, return only the inputs.

    Returns:
        `(x, y, sample_weight)`: x = {"token_ids": (B, T) int32, "segment_ids":
        (B, T) int32 (zeros), "padding_mask": (B, T) bool, "mask_positions": (B, P)
        int32}; y = the original ids at mask_positions (B, P) int32; sample_weight
        (B, P) float32, 1.0 for real selections and 0.0 for the unused slots of
        short texts (their position is 0 and their label the padding id).

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> tokenizer = WordPieceTokenizer.from_vocabulary(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "a", "dog"])
    >>> preprocessor = BertMaskedLMPreprocessor(tokenizer, sequence_length=16, seed=0)
    >>> x, y, w = preprocessor(["the quick brown fox"])
    >>> x["mask_positions"].shape, y.shape, w.tolist()
    ((1, 2), (1, 2), [[1.0, 0.0]])
    """

    def __init__(
        self,
        tokenizer,
        sequence_length=128,
        mask_selection_rate=0.15,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        max_selections=None,
        seed=None,
        truncate=False,
    ):
        super().__init__(tokenizer, sequence_length)
        for name in ("cls_token_id", "sep_token_id", "mask_token_id", "pad_token_id"):
            if getattr(tokenizer, name) is None:
                raise ValueError(f"The tokenizer has no {name[:-3]}, which BERT inputs need. Received: {name}=None")
        if not (_is_real(mask_selection_rate) and 0.0 < mask_selection_rate <= 1.0):
            raise ValueError(
                f"`mask_selection_rate` must be in (0, 1]. Received: mask_selection_rate={mask_selection_rate!r}"
            )
        for name, rate in (("mask_token_rate", mask_token_rate), ("random_token_rate", random_token_rate)):
            if not (_is_real(rate) and 0.0 <= rate <= 1.0):
                raise ValueError(f"`{name}` must be in [0, 1]. Received: {name}={rate!r}")
        if mask_token_rate + random_token_rate > 1.0:
            raise ValueError(
                "`mask_token_rate + random_token_rate` must be at most 1. Received: "
                f"mask_token_rate={mask_token_rate}, random_token_rate={random_token_rate}"
            )
        if max_selections is not None and (
            not isinstance(max_selections, int) or isinstance(max_selections, bool) or max_selections < 1
        ):
            raise ValueError(
                f"`max_selections` must be a positive int or None. Received: max_selections={max_selections!r}"
            )
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
        self.mask_selection_rate = mask_selection_rate
        self.mask_token_rate = mask_token_rate
        self.random_token_rate = random_token_rate
        self.max_selections = max_selections
        self.seed = seed
        self.truncate = truncate
        self._num_slots = max_selections or max(1, round(mask_selection_rate * sequence_length))
        self._rng = np.random.default_rng(seed)
        self._special_ids = np.array(
            sorted(
                {
                    i
                    for i in (
                        getattr(tokenizer, f"{n}_token_id") for n in ("pad", "bos", "eos", "unk", "mask", "cls", "sep")
                    )
                    if i is not None
                }
            )
        )
        # Random replacements are ordinary tokens: never [PAD], [CLS], [MASK], ...
        self._ordinary_ids = np.setdiff1d(np.arange(tokenizer.vocabulary_size), self._special_ids)
        if self._ordinary_ids.size == 0:
            raise ValueError("The tokenizer's vocabulary has only special tokens: there is nothing to mask.")

    def get_config(self):
        return {
            **super().get_config(),
            "mask_selection_rate": self.mask_selection_rate,
            "mask_token_rate": self.mask_token_rate,
            "random_token_rate": self.random_token_rate,
            "max_selections": self.max_selections,
            "seed": self.seed,
            "truncate": self.truncate,
        }

    def __call__(self, x, y=None, sample_weight=None, predict=False):
        if y is not None or sample_weight is not None:
            raise ValueError(
                "A masked LM learns from the text itself: pass only `x` (the strings), not `y` or `sample_weight`."
            )
        token_ids, segment_ids, padding_mask = pack_bert_inputs(
            self.tokenizer, [self.tokenize_texts(x)], self.sequence_length, self.truncate
        )
        batch_size = token_ids.shape[0]
        mask_positions = np.zeros((batch_size, self._num_slots), dtype="int32")
        labels = np.full((batch_size, self._num_slots), self.tokenizer.pad_token_id, dtype="int32")
        weights = np.zeros((batch_size, self._num_slots), dtype="float32")
        masked_ids = token_ids.copy()
        for row in range(batch_size):
            candidates = np.flatnonzero(padding_mask[row] & ~np.isin(token_ids[row], self._special_ids))
            if candidates.size == 0:
                continue
            count = min(self._num_slots, max(1, round(self.mask_selection_rate * candidates.size)))
            chosen = np.sort(self._rng.choice(candidates, size=count, replace=False))  # (count,)
            mask_positions[row, :count] = chosen
            labels[row, :count] = token_ids[row, chosen]
            weights[row, :count] = 1.0
            draws = self._rng.random(count)
            to_mask = draws < self.mask_token_rate
            to_random = (draws >= self.mask_token_rate) & (draws < self.mask_token_rate + self.random_token_rate)
            masked_ids[row, chosen[to_mask]] = self.tokenizer.mask_token_id
            masked_ids[row, chosen[to_random]] = self._rng.choice(self._ordinary_ids, size=int(to_random.sum()))
        inputs = {
            "token_ids": masked_ids,
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
            "mask_positions": mask_positions,
        }
        if predict:
            return inputs, None, None
        return inputs, labels, weights


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
