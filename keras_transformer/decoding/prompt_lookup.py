"""Prompt lookup: draft tokens copied from the history (prompt, output so far, and a seq2seq model's source)
where its last n-gram occurred before, as transformers' `PromptLookupCandidateGenerator` does, with two
changes that make more drafts agree:
- the latest earlier occurrence of the n-gram, where transformers takes the earliest: in text that repeats a
  part of the history with changes (code edited, a loop the output fell into), the latest copy is the one
  being followed;
- a continuation that reaches the history's end goes on periodically (the span from the match to the end,
  again): what followed the n-gram last time is followed again. transformers stops at the end (fewer drafts).

Axes: R decoded rows, S history length, K draft tokens.

Written in `keras.ops` with static shapes, so that it runs inside every backend's compiled loop: no
host round trip, no data-dependent shape. A row with no match gets filler drafts (0): the verify pass
rejects what the model does not predict, so drafts change the speed only, never the tokens.
"""

from keras import ops


def propose(history, end, max_ngram, num_tokens):
    """Draft tokens (R, K) int32 from `history` (R, S) int32, -1 where a position is unknown or padding.

    end: (R,) int32, the history's position just after each row's last known token: the n-gram matched
    is history[end - n : end]. For n from `max_ngram` down to 1 the latest earlier occurrence of that
    n-gram with at least one token after it gives the drafts, the K tokens that followed it (periodically
    past the end); the first n with a match wins (transformers' order).
    """
    length = history.shape[1]
    starts = ops.arange(length, dtype="int32")  # (S,)
    best = ops.zeros_like(end)  # (R,): where the chosen continuation starts
    found = ops.zeros(ops.shape(end), "bool")
    for n in range(max_ngram, 0, -1):
        # (R, S + n): history[:, j + t] exists for every start j (a concatenation: Keras's pad is an operation
        # object, whose naming counter a compiled PyTorch step would guard on)
        padded = ops.concatenate([history, ops.full((ops.shape(history)[0], n), -1, "int32")], axis=1)
        match = ops.logical_and(starts[None, :] + n < end[:, None], (end >= n)[:, None])  # (R, S)
        for t in range(n):
            last = ops.take_along_axis(history, ops.maximum(end - n + t, 0)[:, None], axis=1)  # (R, 1)
            match = ops.logical_and(match, padded[:, t : t + length] == last)
        latest = ops.amax(ops.where(match, starts[None, :], -1), axis=1)  # (R,): the latest start, else -1
        take = ops.logical_and(latest >= 0, ops.logical_not(found))
        best = ops.where(take, latest + n, best)
        found = ops.logical_or(found, latest >= 0)
    period = ops.maximum(end - best, 1)[:, None]  # (R, 1): the span from the continuation to the end
    columns = best[:, None] + ops.arange(num_tokens, dtype="int32")[None, :] % period  # (R, K)
    columns = ops.clip(columns, 0, length - 1)
    drafts = ops.take_along_axis(history, columns, axis=1)
    return ops.where(ops.logical_and(found[:, None], drafts >= 0), drafts, 0)
