"""The speculative decoding loop, written once for every backend: propose K tokens, verify them in one cached
step of K + 1 tokens, keep the longest agreeing run and the model's own next token.

Axes: R decoded rows (B inputs; no beams), L token buffer (and cache) length, K draft tokens, V vocabulary,
S_enc source length.

A step at position i (every row knows its tokens [0, i), its cache holds positions [0, i - 1)):
- propose: each row's drafts for the positions after the ones it knows (`prompt_lookup.propose`); a row
  still inside its longer prompt knows its prompt, and its "drafts" there are the prompt itself;
- verify: the model's one cached step on the K + 1 tokens at positions [s, s + K], s = i - 1 (s earlier
  near the buffer's end, so that the window fits: the positions before i are then fed again, as known);
  its logits j choose position p_j = s + 1 + j, after the logits processors, on the hypothesis buffer
  (the drafts in place), so that each choice is the one plain decoding makes after that prefix;
- accept: a row agrees up to its first draft that differs from the model's choice; all rows advance by
  the smallest agreeing run plus one (the model's token after it). Every token written is the one plain
  greedy decoding writes at that position: exact, whatever the drafts;
- roll back: only the position moves. The cache keeps the keys of rejected drafts past it; the causal mask
  hides them and the next verify pass writes over them (no cache copy).

Batch > 1 advances by the smallest accepted count (one position for the whole batch, as the plain loop
has); a row that agreed further loses those tokens and proposes them again at the next step.
The cache is one width L for the whole loop (the window may sit anywhere in it).
"""

from typing import Any, NamedTuple

from keras import ops

from keras_transformer.decoding.cache_schedule import loop_cache, model_cache, widen
from keras_transformer.decoding.decode_loop import model_step, start
from keras_transformer.decoding.draft_model import draft_proposals, draft_state
from keras_transformer.decoding.loop_state import ABSENT, present
from keras_transformer.decoding.prompt_lookup import propose
from keras_transformer.decoding.rejection import sampled_choices
from keras_transformer.samplers.processors import NEG, is_stop_token, process
from keras_transformer.samplers.rows import column


class SpeculativeState(NamedTuple):
    """The speculative loop's own part of the loop state (`LoopState.sampler`)."""

    done: Any  # (R,) bool: the row stopped, or reached its limit
    emitted: Any  # (R, K + 1) int32: the tokens the row produced at the last step, in order, -1 where none
    steps: Any  # int32 scalar: verify passes run so far
    draft: Any = ABSENT  # a draft model's `DraftState`


def speculative_start(spec, speculation, inputs, prepared, draft_prepared=ABSENT):
    """Loop state from the prepared cache (and the draft model's), its cache one width L. Returns (i, state)."""
    i, state = start(spec, inputs, prepared)
    length = inputs.token_ids.shape[1]
    state = widen(state, length)
    rows = ops.shape(inputs.token_ids)[0]
    own = SpeculativeState(
        done=state.sampler.done,
        emitted=ops.full((rows, draft_count(speculation, inputs.token_ids.shape[1]) + 1), -1, "int32"),
        steps=ops.zeros((), "int32"),
        draft=draft_state(draft_prepared, length, spec.options.flat_cache) if present(draft_prepared) else ABSENT,
    )
    return i, state._replace(sampler=own)


def draft_count(speculation, length):
    """K: the tokens proposed per step, at most L - 1 (the verify window of K + 1 fits the buffer)."""
    return max(1, min(speculation.num_draft_tokens, length - 1))


def speculative_body(spec, speculation, ctx, i, state, source=ABSENT, head=None, kernels=None, draft=None):
    """One step: propose, verify, accept (see the module docstring). Returns (next i, state).

    draft: None (prompt lookup), or (the draft task, its `call_layer` or None).
    """
    options, rows, done = spec.options, state.rows, state.sampler.done
    L = ctx.length
    K = draft_count(speculation, L)
    known = ops.maximum(i, ctx.prompt_lengths)  # (R,): each row knows its tokens [0, known)
    draft_probabilities = None  # a copied draft is certain
    if draft is None:
        drafts, first = _drafts(rows.tokens, known, source, speculation, K), known  # (R, K); (R,): their place
    else:
        drafts, draft_probabilities, drafted = draft_proposals(
            *draft, spec.sampler, ctx, i, known, rows.tokens, state.sampler.draft, K, state.sampler.steps
        )
        first = ops.zeros_like(known) + i
        state = state._replace(sampler=state.sampler._replace(draft=drafted))
    # The hypothesis: the tokens with the drafts in place, (R, L) for the processors (unused, and so not computed,
    # where none reads the tokens), and its window [s, s + K] overlaid on its own (R, K + 1) columns: derived from
    # the (R, L) one, XLA fused that whole computation into the embedding's gather.
    hypothesis = _overlay(rows.tokens, ops.arange(L, dtype="int32"), first, drafts, K)  # (R, L)
    s = ops.minimum(i - 1, L - K - 1)  # the window [s, s + K]
    own = _columns(rows.tokens, s, K + 1, options.gather_columns)  # (R, K + 1)
    window = _overlay(own, positions_after(s - 1, K + 1), first, drafts, K)  # (R, K + 1)
    cache = model_cache(rows.cache, ctx.num_rows, options.flat_cache)
    logits, cache = model_step(spec.task, window, cache, s, state.encoded, head, kernels)  # (R, K + 1, V)
    rows = rows._replace(cache=loop_cache(cache, options.flat_cache))
    chosen = _choices(spec, ctx, rows, hypothesis, logits, i, s, K, draft_probabilities, state.sampler.steps)
    drafted = positions_after(s, K)  # (K,): the drafts' positions p_j = s + 1 + j
    forced = drafted[None, :] < known[:, None]  # (R, K): a known position holds its token, which is the choice
    agrees = ops.logical_or(forced, window[:, 1:] == chosen[:, :K])  # (R, K)
    agreed = ops.cumsum(ops.cast(ops.logical_not(agrees), "int32"), axis=1) == 0  # (R, K): all drafts up to j agree
    accepted = ops.sum(ops.cast(ops.logical_or(agreed, done[:, None]), "int32"), axis=1)  # (R,)
    following = s + 2 + ops.amin(accepted)  # the smallest run of agreed drafts, then the model's own token
    following = ops.minimum(following, L)
    state = _write(ctx, rows, state, i, s, following, chosen, logits, K)
    return following, state


def _drafts(tokens, known, source, speculation, K):
    """Prompt lookup's drafts (R, K) from the row's known tokens (after its source, for a seq2seq model)."""
    positions = ops.arange(ops.shape(tokens)[1], dtype="int32")[None, :]  # (1, L)
    history = ops.where(positions < known[:, None], tokens, -1)  # (R, L)
    end = known
    if present(source):  # (R, S_enc), -1 on padding: matched before the output
        history = ops.concatenate([ops.cast(source, "int32"), history], axis=1)  # (R, S_enc + L)
        end = known + ops.shape(source)[1]
    return propose(history, end, speculation.max_matching_ngram_size, K)


def _overlay(own, positions, first, drafts, K):
    """own (R, N), the tokens at `positions` (N,), with the drafts (R, K) in place at each row's [first, first + K)."""
    offset = positions[None, :] - first[:, None]  # (R, N)
    at = ops.take_along_axis(drafts, ops.clip(offset, 0, K - 1), axis=1)  # (R, N)
    return ops.where(ops.logical_and(offset >= 0, offset < K), at, own)


def _columns(tokens, first, count, gather):
    """tokens (R, L)[:, first : first + count] with `first` a scalar tensor (see `rows.column`)."""
    if gather:
        return ops.take(tokens, first + ops.arange(count, dtype="int32"), axis=1)
    return ops.slice(tokens, (0, first), (ops.shape(tokens)[0], count))


def _choices(spec, ctx, rows, hypothesis, logits, i, s, K, draft_probabilities=None, verify_pass=0):
    """The sampler's tokens (R, K + 1): column j at position p_j = s + 1 + j, its logits processed as plain
    decoding processes them at p_j after the hypothesis (the seen tokens grow with the drafts before p_j)."""
    sampler, options = spec.sampler, spec.options
    random = ctx.seed is not None  # a sampler that draws: the rejection rule (`rejection.py`)
    if not random and not options.repetition and not options.no_repeat_ngram_size:  # no processor reads tokens
        return _choices_at_once(sampler, ctx, logits, s, K)
    seen = rows.seen
    scores = []
    for j in range(K + 1):
        p = s + 1 + j
        view = rows._replace(tokens=hypothesis, seen=seen)
        scores.append(process(sampler._prepare_scores(logits[:, j]), view, p, ctx))  # (R, V)
        if options.repetition and j < K:  # the hypothesis' token at p is seen by the choices after it
            token = column(hypothesis, ops.minimum(p, ctx.length - 1), options.gather_columns)
            new = ops.logical_and(ops.one_hot(token, ctx.vocabulary_size, dtype="int32") > 0, p >= i)
            seen = ops.logical_or(seen, new)
    if random:
        chosen = sampled_choices(
            sampler, ctx, scores, hypothesis, s, options.gather_columns, draft_probabilities, i, verify_pass
        )
    else:
        chosen = [ops.cast(sampler.get_next_token(score, None), "int32") for score in scores]
    return ops.stack(chosen, axis=1)  # K + 1 x (R,) -> (R, K + 1)


def _choices_at_once(sampler, ctx, logits, s, K):
    """`_choices` where the only processor is the minimum length (`processors.process`'s last one), which reads
    the position only: every position's choice in one (R * (K + 1), V) pick."""
    scores = sampler._prepare_scores(logits)  # (R, K + 1, V)
    if ctx.stop_token_ids:
        positions = positions_after(s, K + 1)  # (K + 1,)
        too_early = (positions[None, :] - ctx.prompt_lengths[:, None]) < ctx.min_new_tokens  # (R, K + 1)
        stop = is_stop_token(ops.arange(ctx.vocabulary_size, dtype="int32"), ctx.stop_token_ids)  # (V,)
        scores = ops.where(ops.logical_and(too_early[:, :, None], stop), NEG, scores)
    picked = sampler.get_next_token(ops.reshape(scores, (-1, ctx.vocabulary_size)), None)  # (R * (K + 1),)
    return ops.reshape(ops.cast(picked, "int32"), (-1, K + 1))  # -> (R, K + 1)


def _write(ctx, rows, state, i, s, following, chosen, logits, K):
    """Write the positions [i, following) as plain decoding does: a row's prompt token, pad after it is done, else
    the choice; a row is done at a stop token or its limit. All K + 1 window positions at once (no loop: a few
    operations per pass, whatever K). Returns the new state."""
    options, done = ctx.options, state.sampler.done
    p = positions_after(s, K + 1)  # (K + 1,): the window's chosen positions
    active = ops.logical_and(p >= i, p < following)[None, :]  # (1, K + 1): the positions written
    old = ops.take(rows.tokens, ops.minimum(p, ctx.length - 1), axis=1)  # (R, K + 1)
    in_prompt = p[None, :] < ctx.prompt_lengths[:, None]  # (R, K + 1)
    stops = ops.logical_and(ops.logical_not(in_prompt), is_stop_token(chosen, ctx.stop_token_ids))
    finishes = ops.logical_and(active, ops.logical_or(stops, (p + 1)[None, :] >= ctx.limits[:, None]))  # (R, K + 1)
    finished = ops.cumsum(ops.cast(finishes, "int32"), axis=1)  # (R, K + 1): finishing positions up to j
    before = ops.logical_or(done[:, None], finished - ops.cast(finishes, "int32") > 0)  # (R, K + 1): done before j
    token = ops.where(in_prompt, old, ops.where(before, ctx.pad_id, chosen))  # (R, K + 1)
    out = ops.logical_and(active, ops.logical_not(ops.logical_or(in_prompt, before)))
    positions = ops.arange(ctx.length, dtype="int32")  # (L,)
    written = ops.logical_and(positions >= i, positions < following)  # (L,): the active positions (s + 1 <= i)
    slot = ops.clip(positions - s - 1, 0, K)  # (L,): a position's column in the window
    tokens = ops.where(written[None, :], ops.take(token, slot, axis=1), rows.tokens)  # (R, L)
    seen, kept = rows.seen, rows.logits
    if options.repetition:  # (R, K + 1, V) -> (R, V): every written token is seen
        new = ops.logical_and(active[:, :, None], ops.one_hot(token, ctx.vocabulary_size, dtype="int32") > 0)
        seen = ops.logical_or(seen, ops.any(new, axis=1))
    if options.return_logits:  # (R, K + 1, V) -> (R, L, V)
        kept = ops.where(written[None, :, None], ops.take(logits, slot, axis=1), kept)
    done = ops.logical_or(done, finished[:, -1] > 0)
    rows = rows._replace(tokens=tokens, seen=seen, logits=kept)
    emitted = ops.where(out, token, -1)  # (R, K + 1)
    own = state.sampler._replace(done=done, emitted=emitted, steps=state.sampler.steps + 1)
    return state._replace(rows=rows, sampler=own)


def positions_after(s, count):
    """The `count` positions after the scalar s: (count,) int32."""
    return s + 1 + ops.arange(count, dtype="int32")


def speculative_run(
    spec, speculation, inputs, prepared, source=ABSENT, kernels=None, draft=None, draft_prepared=ABSENT
):
    """The whole speculative loop in one traced function (one while loop). draft: as `speculative_body`'s;
    draft_prepared: the draft's prefill (`Prepared`)."""
    task, sampler = spec.task, spec.sampler
    i, state = speculative_start(spec, speculation, inputs, prepared, draft_prepared)
    ctx = spec.context(inputs)
    head = None
    if hasattr(task, "decode_head") and (kernels is None or getattr(kernels, "takes_decode_head", False)):
        head = task.decode_head()

    def cond(i, state):
        return ops.logical_and(i < ctx.length, sampler._is_running(state))

    def body(i, state):
        return speculative_body(spec, speculation, ctx, i, state, source, head, kernels, draft)

    i, state = ops.while_loop(cond, body, (i, state))
    return speculative_outputs(spec, state)


def speculative_step(spec, speculation, inputs, i, state, source=ABSENT, kernels=None, draft=None):
    """One step run on its own (a PyTorch step compiled one by one)."""
    return speculative_body(spec, speculation, spec.context(inputs), i, state, source, kernels=kernels, draft=draft)


def speculative_one_step(spec, speculation, inputs, i, state, source=ABSENT, kernels=None, draft=None):
    """One step as a one-iteration loop (XLA: `i` a loop variable, not a compile-time constant)."""
    first = i
    ctx = spec.context(inputs)

    def cond(i, state):
        return ops.logical_and(i <= first, i < ctx.length)

    def body(i, state):
        return speculative_body(spec, speculation, ctx, i, state, source, kernels=kernels, draft=draft)

    return ops.while_loop(cond, body, (i, state))


def speculative_outputs(spec, state):
    """The token buffer, every position's logits where the options keep them, and the verify passes run."""
    result = dict(spec.sampler._outputs(state))
    if present(state.rows.logits):
        result["logits"] = state.rows.logits
    result["steps"] = state.sampler.steps
    return result
