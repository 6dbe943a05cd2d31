"""Packing BERT inputs: [CLS] a [SEP] (b [SEP]), segment ids 0/1, right padding (numpy)."""

import numpy as np


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
    budget = sequence_length - 1 - len(segments)  # room left by [CLS] and one [SEP] per segment
    if budget < 0:
        raise ValueError(
            f"`sequence_length` must leave room for the {len(segments) + 1} special tokens. "
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
        ids, types = [tokenizer.cls_token_id], [0]
        for segment_index, part in enumerate(parts):
            ids += part + [tokenizer.sep_token_id]
            types += [segment_index] * (len(part) + 1)
        token_ids[row, : len(ids)] = ids
        segment_ids[row, : len(ids)] = types
        padding_mask[row, : len(ids)] = True
    return token_ids, segment_ids, padding_mask


def _truncate_longest_first(parts, budget):
    parts = [list(p) for p in parts]
    while sum(len(p) for p in parts) > budget:
        # Ties cut the second segment, as Hugging Face does.
        longest = max(reversed(range(len(parts))), key=lambda i: len(parts[i]))
        parts[longest].pop()
    return parts
