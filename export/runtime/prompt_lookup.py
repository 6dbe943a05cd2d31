"""Prompt-lookup speculative decoding in the bundle (issue 41): greedy, and exactly plain greedy's tokens.

Axes: T draft tokens + 1, V vocabulary, Hkv key/value heads, L the model's max_length, Dh head size.

A row drafts up to K tokens by copying what followed the latest earlier occurrence of its last n-gram
(n = `max_ngram` down to 1) in its prompt and output so far (transformers' `prompt_lookup_num_tokens`, no
draft model), then checks them in one pass of the decode graph's multi-token step: its last token and the
K drafts after its past, K + 1 positions' logits at once. The drafts agreeing with the greedy choice at their
position are kept, and the greedy choice after the last kept one comes free. A rejected draft's keys/values
stay in the cache buffer past the row's length, unread (attention reads each row's own length) and written
over by the next pass: rollback is the position, not a copy. Each pass is a batch of one (GroupQueryAttention
takes several tokens after a past only so), so it runs beside the batch, a sequence at a time.
"""

import time

import numpy as np

from decode_loop import Interrupted

__all__ = ["draft", "greedy", "serve"]


def draft(history, num_tokens, max_ngram=2):
    """Up to `num_tokens` ids copied from after the latest earlier occurrence of `history`'s last n-gram, the
    longest n <= `max_ngram` that occurs; [] when none does.

    >>> draft([5, 6, 7, 8, 5, 6], 3)
    [7, 8, 5]
    >>> draft([1, 2, 3], 2)
    []
    """
    tokens = np.asarray(history)
    for n in range(min(max_ngram, tokens.size - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # (S - n, n): the starts before the last
        found = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if found.size:
            start = int(found[-1]) + n
            return tokens[start : start + num_tokens].tolist()
    return []


def greedy(generator, prompt, emit, num_tokens, max_ngram=2, interrupt=None):
    """Greedy decoding of one causal LM prompt with prompt lookup: each token goes to `emit(token, logits (V,))`,
    which returns None to go on or a finish reason (a stop token, the length limit) -> (drafted, accepted): how
    many drafts were checked, and kept. `interrupt`: None, or asked before every pass (True: `Interrupted`)."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"`prompt_lookup_num_tokens` must be a positive int. Received: {num_tokens!r}")
    logits, state = generator._prefill(np.asarray([prompt], np.int64))  # (1, V); past 2L x (1, S, Hkv, Dh)
    heads, head_dim = generator._cache_shape
    length = int(generator.config["max_length"])
    buffers = []
    for past in state["past"]:
        buffer = np.zeros((1, heads, length, head_dim), np.float32)  # (1, Hkv, L, Dh)
        buffer[0, :, : len(prompt)] = past[0].transpose(1, 0, 2)  # (S, Hkv, Dh) -> (Hkv, S, Dh)
        buffers.append(buffer)
    history = list(prompt) + [int(np.argmax(logits[0]))]
    drafted = accepted = 0
    if emit(history[-1], logits[0]) is not None:
        return drafted, accepted
    while True:
        if interrupt is not None and interrupt():
            raise Interrupted("generation interrupted by its caller")
        position = len(history) - 1  # the last token's: not in the cache yet
        guess = draft(history, min(num_tokens, length - 1 - position), max_ngram)
        tokens = [history[-1]] + guess  # (T,)
        logits = generator.step_in_place(buffers, [tokens], [list(range(position, position + len(tokens)))])[0]
        chosen = np.argmax(logits, axis=-1)  # (T,): the greedy token after each position
        kept = 0
        while kept < len(guess) and guess[kept] == chosen[kept]:
            kept += 1
        drafted, accepted = drafted + len(guess), accepted + kept
        for i in range(kept + 1):  # the kept drafts, then the greedy choice after them
            history.append(int(chosen[i]))
            if emit(history[-1], logits[i]) is not None:
                return drafted, accepted


def serve(generator, sequence, flush):
    """A server's sequence (`sequence.Sequence` with `prompt_lookup_num_tokens`) decoded whole: each token to
    `sequence.accept` as it is kept, `flush()` after each pass (its tokens go out), then its finish; its
    `drafted` and `accepted` counts set. Stops before a pass once it is cancelled or past its deadline."""
    reason = None

    def emit(token, logits):
        nonlocal reason
        reason = sequence.accept(token, logits)
        return reason

    def interrupt():
        flush()
        return sequence.interrupted(time.monotonic()) is not None

    try:
        sequence.drafted, sequence.accepted = greedy(
            generator, sequence.prompt_ids, emit, sequence.prompt_lookup_num_tokens, interrupt=interrupt
        )
    except Interrupted:
        reason = sequence.interrupted(time.monotonic()) or "timeout"
    sequence.on_event("finish", reason or "length")
