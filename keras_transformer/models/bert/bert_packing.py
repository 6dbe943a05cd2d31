"""Packing BERT inputs: [CLS] a [SEP] (b [SEP]), segment ids 0/1, right padding (numpy); a text pair as the
tokenizer's own template packs it where it has one (RoBERTa's <s> a </s></s> b </s>, segment ids 0)."""

from typing import NamedTuple

import numpy as np


class PairLayout(NamedTuple):
    """Where a pair's special tokens go and each part's segment id: lists of (id, segment id) before the first
    text, between the texts and after the second; the segment ids of the first and second texts' tokens."""

    prefix: list
    middle: list
    suffix: list
    first: int
    second: int


def pair_layout(tokenizer):
    """The pair template of the tokenizer's tokenizer.json post-processor (what `transformers`' `tokenizer(a, b)`
    applies), or BERT's [CLS] a [SEP] b [SEP] (segments 0, 1) when it has none that adds special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    processor = backend.post_processor if backend is not None else None
    if processor is None or processor.num_special_tokens_to_add(True) == 0:
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        return PairLayout([(cls, 0)], [(sep, 0)], [(sep, 1)], 0, 1)
    # Two one-token texts through the template: its special tokens and segment ids around them.
    first, second = (backend.encode(text, add_special_tokens=False) for text in ("a", "b"))
    first.truncate(1), second.truncate(1)
    packed = backend.post_process(first, second)
    where = {sequence: packed.sequence_ids.index(sequence) for sequence in (0, 1)}
    tokens = list(zip(packed.ids, packed.type_ids))
    return PairLayout(
        tokens[: where[0]],
        tokens[where[0] + 1 : where[1]],
        tokens[where[1] + 1 :],
        packed.type_ids[where[0]],
        packed.type_ids[where[1]],
    )


def pack_bert_inputs(tokenizer, segments, sequence_length, truncate):
    """One or two segments of id lists -> BERT's packed inputs.

    Args:
        tokenizer: a Tokenizer with `cls_token_id`, `sep_token_id` and `pad_token_id`.
        segments: a list of 1 or 2 lists of id lists, all of the same length B.
        sequence_length: int, T.
        truncate: bool. When True, too-long examples lose tokens from the end of
            their longest segment until they fit ("longest first", as Hugging Face);
            when False they are a ValueError.

    Returns:
        (token_ids (B, T) int32, segment_ids (B, T) int32, padding_mask (B, T) bool).
    """
    batch_size = len(segments[0])
    layout = pair_layout(tokenizer) if len(segments) == 2 else None
    # Room left by [CLS] and one [SEP] per segment, or by the pair template's special tokens.
    budget = sequence_length - (
        1 + len(segments) if layout is None else len(layout.prefix + layout.middle + layout.suffix)
    )
    if budget < 0:
        raise ValueError(
            f"`sequence_length` must leave room for the {sequence_length - budget} special tokens. "
            f"Received: sequence_length={sequence_length}"
        )
    token_ids = np.full((batch_size, sequence_length), tokenizer.pad_token_id, dtype="int32")
    segment_ids = np.zeros((batch_size, sequence_length), dtype="int32")
    padding_mask = np.zeros((batch_size, sequence_length), dtype=bool)
    for row in range(batch_size):
        parts = [list(segment[row]) for segment in segments]
        if sum(len(p) for p in parts) > budget:
            if not truncate:
                lengths = " + ".join(str(len(p)) for p in parts)
                raise ValueError(
                    f"Example {row} has {lengths} tokens, more than the {budget} that fit in "
                    f"sequence_length={sequence_length} with the special tokens. Pass truncate=True "
                    "to cut it, or use a larger sequence_length."
                )
            parts = _truncate_longest_first(parts, budget)
        ids, types = _row(tokenizer, parts, layout)
        token_ids[row, : len(ids)] = ids
        segment_ids[row, : len(ids)] = types
        padding_mask[row, : len(ids)] = True
    return token_ids, segment_ids, padding_mask


def _row(tokenizer, parts, layout):
    """(ids, segment ids) of one example: [CLS] a [SEP] (single texts), or a pair laid out by `layout`."""
    if layout is None:
        return [tokenizer.cls_token_id, *parts[0], tokenizer.sep_token_id], [0] * (len(parts[0]) + 2)
    pieces = [layout.prefix, [(i, layout.first) for i in parts[0]], layout.middle]
    pieces += [[(i, layout.second) for i in parts[1]], layout.suffix]
    tokens = [token for piece in pieces for token in piece]
    return [i for i, _ in tokens], [t for _, t in tokens]


def _truncate_longest_first(parts, budget):
    parts = [list(p) for p in parts]
    while sum(len(p) for p in parts) > budget:
        # Ties cut the second segment, as Hugging Face does.
        longest = max(reversed(range(len(parts))), key=lambda i: len(parts[i]))
        parts[longest].pop()
    return parts
