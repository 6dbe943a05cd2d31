"""Speculative decoding in the bundle (issue 41): drafts from prompt lookup or from a draft bundle, checked by the
target in one pass. Greedy gives exactly plain greedy's tokens; random sampling keeps the target's distribution.

Axes: T draft tokens + 1, V vocabulary, Hkv key/value heads, L the model's max_length, Dh head size.

A row drafts up to K tokens, then checks them in one pass of the decode graph's multi-token step: its last token
and the K drafts after its past, K + 1 positions' logits at once. Greedy keeps the drafts agreeing with the greedy
choice at their position, and the greedy choice after the last kept one comes free; random sampling keeps them by
the rejection rule (`sampling.speculative_accept`). A rejected draft's keys/values stay in the cache buffer past the
row's length, unread (attention reads each row's own length) and written over by the next pass: rollback is the
position, not a copy. Each pass is a batch of one (GroupQueryAttention takes several tokens after a past only so),
so a call runs its rows one after another, and a server runs such a sequence beside the batch.

The drafts come from:
- prompt lookup (`draft`): what followed the latest earlier occurrence of the row's last n-gram (n = `max_ngram`
  down to 1) in its prompt and output so far (transformers' `prompt_lookup_num_tokens`); greedy only;
- a draft bundle (`DraftProposer`): a smaller causal LM bundle of the same vocabulary, K greedy (or sampled) steps
  of its own cache (transformers' `assistant_model`, Keras's `draft_model`).
"""

import os
import time

import numpy as np

from decode_loop import Interrupted
from sampling import Picker, draw, seed_to_int32, speculative_accept

__all__ = ["DraftProposer", "check_draft", "check_model", "draft", "generate_rows", "serve", "speculate"]


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


def prefill_row(generator, prompt):
    """One prompt (S ints) through `generator`'s prefill graph -> (the next position's logits (V,), cache buffers
    2L x (1, Hkv, L, Dh) holding its S positions, for `Generator.step_in_place`)."""
    logits, state = generator._prefill(np.asarray([prompt], np.int64))  # (1, V); past 2L x (1, S, Hkv, Dh)
    heads, head_dim = generator._cache_shape
    length = int(generator.config["max_length"])
    buffers = []
    for past in state["past"]:
        buffer = np.zeros((1, heads, length, head_dim), np.float32)  # (1, Hkv, L, Dh)
        buffer[0, :, : len(prompt)] = past[0].transpose(1, 0, 2)  # (S, Hkv, Dh) -> (Hkv, S, Dh)
        buffers.append(buffer)
    return logits[0], buffers


class _Lookup:
    """Prompt lookup's proposals: no model, no state."""

    def __init__(self, max_ngram=2):
        self.max_ngram = max_ngram

    def propose(self, history, num_tokens):
        return draft(history, num_tokens, self.max_ngram), None

    def keep(self, length):
        pass


class DraftProposer:
    """A draft bundle's proposals for one sequence, its own cache kept in step with the sequence.

    The draft's cache holds the sequence's first `filled` positions. A proposal feeds it the tokens of the history
    it has not seen (the last one, and the correction of the previous pass; several in one multi-token step), then
    one token per step: K steps, K drafts, the last never fed. After the check, `keep(n)` rolls its write position
    back to the n positions the target kept, so no cache is copied.

    Args:
        generator: the draft bundle's `Generator` (a causal LM whose decode graph takes several tokens).
        prompt: the sequence's prompt ids, prefilled into the draft's own cache.
        picker: None (greedy drafts), or a random `Picker`: each draft drawn from `picker.probabilities`.
        rng: a numpy `Generator`, the draws' uniform numbers (with `picker`).
    """

    def __init__(self, generator, prompt, picker=None, rng=None):
        self.generator, self.picker, self.rng = generator, picker, rng
        _, self.buffers = prefill_row(generator, prompt)
        self.filled = len(prompt)

    def propose(self, history, num_tokens):
        """Up to `num_tokens` drafts after `history` (its ids so far) -> (drafts, None for greedy, else the
        distributions they were drawn from (K, V))."""
        feed, drafts, proposal = list(history[self.filled :]), [], []
        for _ in range(num_tokens):
            positions = list(range(self.filled, self.filled + len(feed)))
            logits = self.generator.step_in_place(self.buffers, [feed], [positions])[0, -1]  # (V,)
            self.filled += len(feed)
            if self.picker is None:
                drafts.append(int(np.argmax(logits)))
            else:
                proposal.append(self.picker.probabilities(logits[None])[0])
                drafts.append(draw(proposal[-1], 1.0 - self.rng.random()))
            feed = drafts[-1:]
        return drafts, np.stack(proposal) if proposal else None

    def keep(self, length):
        """The sequence's first `length` positions agree with what the draft was fed: forget the rest."""
        self.filled = min(self.filled, length)


def speculate(generator, prompt, emit, proposer, num_tokens, max_new_tokens, rule=None, interrupt=None):
    """Decode one causal LM prompt speculatively: each token goes to `emit(token, logits (V,))`, which returns None
    to go on or a finish reason (a stop token, the length limit) -> (drafted, accepted): the drafts checked, and
    kept.

    `proposer`: `_Lookup` or `DraftProposer`; `rule`: None (greedy) or `(picker, rng)` (random sampling, the
    rejection rule). A pass drafts at most `num_tokens`, and no more than the `max_new_tokens` left can take.
    `interrupt`: None, or asked before every pass (True: `Interrupted`).
    """
    logits, buffers = prefill_row(generator, prompt)
    length = int(generator.config["max_length"])
    history = list(prompt) + [_accept(rule, logits[None], [], None)[1]]
    drafted = accepted = 0
    if emit(history[-1], logits) is not None:
        return drafted, accepted
    while True:
        if interrupt is not None and interrupt():
            raise Interrupted("generation interrupted by its caller")
        position = len(history) - 1  # the last token's: not in the cache yet
        left = max_new_tokens - (len(history) - len(prompt))  # a pass gives up to its drafts + 1
        guess, proposal = proposer.propose(history, max(0, min(num_tokens, length - 1 - position, left - 1)))
        tokens = [history[-1]] + guess  # (T,)
        logits = generator.step_in_place(buffers, [tokens], [list(range(position, position + len(tokens)))])[0]
        kept, token = _accept(rule, logits, guess, proposal)
        proposer.keep(position + 1 + kept)
        drafted, accepted = drafted + len(guess), accepted + kept
        for i, token in enumerate(guess[:kept] + [token]):  # the kept drafts, then the token after them
            history.append(int(token))
            if emit(history[-1], logits[i]) is not None:
                return drafted, accepted


def _accept(rule, logits, guess, proposal):
    """The check of one pass: logits (T, V) of the last token and the T - 1 drafts -> (drafts kept, next token)."""
    if rule is None:
        chosen = np.argmax(logits, axis=-1)  # (T,): the greedy token after each position
        kept = 0
        while kept < len(guess) and guess[kept] == chosen[kept]:
            kept += 1
        return kept, int(chosen[kept])
    picker, rng = rule
    return speculative_accept(picker.probabilities(logits), guess, proposal, 1.0 - rng.random(len(guess) + 1))


def generate_rows(generator, rows, max_new_tokens, stop, interrupt, options):
    """`Generator.generate_ids` with speculation: each row's tokens, a row at a time. `options`: its keyword
    arguments (sampler, temperature, top_k, top_p, seed, prompt_lookup_num_tokens, draft, num_draft_tokens).
    Sets `generator.prompt_lookup_counts` or `generator.draft_counts`: (drafted, accepted) per row."""
    draft_generator, num_tokens = _check_call(generator, rows, max_new_tokens, options)
    rule, seed = None, None
    if options["sampler"] == "random":  # a fresh seed per call when none is given, as plain sampling
        seed = seed_to_int32(options["seed"] if options["seed"] is not None else np.random.randint(2**31))
    found, counts = [], []
    for index, row in enumerate(rows):
        tokens = []

        def emit(token, logits):
            tokens.append(token)
            return token in stop or len(tokens) >= max_new_tokens or None

        if seed is not None:
            picker = Picker("random", options["temperature"], options["top_k"], options["top_p"])
            rule = (picker, np.random.default_rng([seed % 2**32, index]))  # row r: the draws of (seed, r)
        proposer = _Lookup() if draft_generator is None else DraftProposer(draft_generator, row.tolist(), *(rule or ()))
        counts.append(speculate(generator, row.tolist(), emit, proposer, num_tokens, max_new_tokens, rule, interrupt))
        found.append(tokens)
    if draft_generator is None:
        generator.prompt_lookup_counts = counts
    else:
        generator.draft_counts = counts
    return found


def _check_call(generator, rows, max_new_tokens, options):
    """What speculation in `generate_ids` cannot take is a `ValueError` -> (the draft's `Generator` or None, K)."""
    lookup, draft_model, num_draft = (options[k] for k in ("prompt_lookup_num_tokens", "draft", "num_draft_tokens"))
    if lookup is not None and draft_model is not None:
        raise ValueError(
            "Speculative decoding takes one proposer: `prompt_lookup_num_tokens` or `draft`, not both. Received: "
            f"prompt_lookup_num_tokens={lookup!r}, draft={draft_model!r}"
        )
    if draft_model is None and num_draft is not None:
        raise ValueError(f"`num_draft_tokens` needs a `draft`. Received: num_draft_tokens={num_draft!r}, draft=None")
    name, num_tokens = ("prompt_lookup_num_tokens", lookup) if draft_model is None else ("num_draft_tokens", num_draft)
    num_tokens = 5 if num_tokens is None and draft_model is not None else num_tokens  # Keras's default
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={num_tokens!r}")
    sampler = options["sampler"]
    if sampler == "beam" or (sampler == "random" and draft_model is None):
        raise ValueError(
            f"Speculative decoding runs with greedy decoding{' or random sampling' if draft_model else ''}, not "
            f"{'beam search' if sampler == 'beam' else 'random sampling with prompt lookup'}. Received: "
            f"sampler={sampler!r}, {name}={num_tokens!r}"
        )
    check_model(generator, "the model", rows, max_new_tokens)
    if draft_model is None:
        return None, int(num_tokens)
    draft_generator = check_draft(generator, draft_model)
    check_model(draft_generator, "the draft", rows, max_new_tokens)
    return draft_generator, int(num_tokens)


def check_model(generator, role, rows=(), max_new_tokens=0):
    """A verify pass needs a causal LM's multi-token decode graph, and a cache that does not go stale on the way
    (a `ValueError` otherwise, naming `role`: "the model" or "the draft"). `rows`: prompts (id lists or arrays)."""
    if generator.kind != "decoder" or not generator.multi_token:
        graph = "" if generator.multi_token else " whose decode graph takes one token per step (traced, or older)"
        raise ValueError(
            f"Speculative decoding needs {role} to be a causal LM bundle whose decode graph takes several tokens. "
            f"Received: a {generator.kind} bundle{graph} at {generator.bundle_dir!r}"
        )
    after = generator.refresh_after  # a verify pass cannot compute a stale cache again (as in Keras)
    if after is not None and any(len(row) <= after + 1 < len(row) + max_new_tokens for row in rows):
        raise ValueError(
            f"Speculative decoding cannot cross position {after}, where {role}'s rotary frequencies change "
            f"(longrope) and its cache is computed again. Received prompts of {[len(row) for row in rows]} tokens "
            f"and max_new_tokens={max_new_tokens}"
        )


def check_draft(generator, draft_model):
    """`draft` (a `Generator` or a bundle directory) -> the draft's `Generator`, checked against `generator`: the
    same vocabulary, and at least as many positions (as Keras's `draft_model`)."""
    if isinstance(draft_model, (str, os.PathLike)):
        draft_model = type(generator)(draft_model)
    elif not hasattr(draft_model, "step_in_place"):
        raise ValueError(f"`draft` must be a bundle's `Generator` or its directory. Received: draft={draft_model!r}")
    ours, theirs = generator.bundle["vocabulary_size"], draft_model.bundle["vocabulary_size"]
    if ours != theirs:
        raise ValueError(
            f"`draft` must have the model's vocabulary: vocabulary_size={ours}. Received: draft with "
            f"vocabulary_size={theirs} ({draft_model.bundle_dir!r})"
        )
    ours, theirs = int(generator.config["max_length"]), int(draft_model.config["max_length"])
    if theirs < ours:
        raise ValueError(
            f"`draft` must take as many positions as the model: max_length >= {ours}. Received: draft with "
            f"max_length={theirs} ({draft_model.bundle_dir!r})"
        )
    return draft_model


def serve(generator, sequence, flush, draft_generator=None):
    """A server's sequence (`sequence.Sequence` with `prompt_lookup_num_tokens`, or `num_draft_tokens` and the
    server's `draft_generator`) decoded whole: each token to `sequence.accept` as it is kept, `flush()` after
    each pass (its tokens go out), then its finish; its `drafted` and `accepted` counts set. Stops before a pass
    once it is cancelled or past its deadline."""
    reason, rule = None, None

    def emit(token, logits):
        nonlocal reason
        reason = sequence.accept(token, logits)
        return reason

    def interrupt():
        flush()
        return sequence.interrupted(time.monotonic()) is not None

    if sequence.temperature > 0:  # choice c of seed s draws what row c of `generate_ids(seed=s)` draws
        picker = Picker("random", sequence.temperature, sequence.top_k, sequence.top_p)
        rule = (picker, np.random.default_rng([sequence.noise_seed % 2**32, sequence.choice]))
    if sequence.num_draft_tokens is None:
        proposer, num_tokens = _Lookup(), sequence.prompt_lookup_num_tokens
    else:
        proposer = DraftProposer(draft_generator, sequence.prompt_ids, *(rule or ()))
        num_tokens = sequence.num_draft_tokens
    try:
        sequence.drafted, sequence.accepted = speculate(
            generator, sequence.prompt_ids, emit, proposer, num_tokens, sequence.max_tokens, rule, interrupt
        )
    except Interrupted:
        reason = sequence.interrupted(time.monotonic()) or "timeout"
    sequence.on_event("finish", reason or "length")
