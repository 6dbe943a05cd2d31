"""A draft model's proposals inside the speculative loop (transformers' `assistant_model`): the draft's own cache
in the loop state, its K greedy one-token steps per verify pass.

Axes: R decoded rows, L token buffer (and cache) length, K draft tokens, V vocabulary.

The draft's cache follows the target's position: before a verify pass at position i the draft feeds the two
tokens at [i - 2, i - 1] (the previous pass may have stopped one position short of them: its last draft was
never fed), then K - 1 of its own drafts one by one. Its cache keeps the keys of rejected drafts past the
position, as the target's does, masked out and written over. What the draft proposes changes the speed only:
the verify pass keeps only what the target itself chooses.
"""

from typing import Any, NamedTuple

from keras import ops

from keras_transformer.decoding.cache_schedule import loop_cache, model_cache
from keras_transformer.decoding.decode_loop import model_step
from keras_transformer.decoding.rejection import noise_step
from keras_transformer.samplers.noise import uniform_noise
from keras_transformer.samplers.random_sampler import sample_categorical
from keras_transformer.samplers.rows import column


class DraftState(NamedTuple):
    """The draft model's part of the loop state."""

    cache: Any  # per layer (keys, values) in the loop's layout, one width L
    encoded: Any  # the draft's `Encoded` (its own encoder's outputs for a seq2seq draft), per row


def draft_state(prepared, length, flat):
    """The draft's `DraftState` from its prefill (`decode_loop.prepare` of the draft), the cache L wide."""

    def pad(t):  # (B, Hkv, W, Dh) -> (B, Hkv, L, Dh)
        return ops.pad(t, [(0, 0), (0, 0), (0, length - t.shape[2]), (0, 0)])

    cache = [tuple(pad(t) for t in pair) for pair in prepared.cache]
    return DraftState(loop_cache(cache, flat), prepared.encoded)


def draft_proposals(draft, kernels, sampler, ctx, i, known, tokens, state, K, verify_pass=0):
    """(drafts (R, K) for the positions [i, i + K), their distributions q (R, K, V) or None (greedy), the new
    `DraftState`): a row still inside its prompt proposes its prompt; the others the draft's tokens, greedy or
    drawn as the sampler draws (its temperature, top-k and top-p on the draft's logits).

    draft: the draft task; kernels: its `call_layer` (PyTorch's kernels) or None; state: its `DraftState`;
    verify_pass: the passes run so far (the noise's counter, see `rejection.noise_step`).
    """
    options, L = ctx.options, ctx.length
    cache = model_cache(state.cache, ctx.num_rows, options.flat_cache)
    first = ops.maximum(i - 2, 0)
    pair = _pair(tokens, first, options.gather_columns)  # (R, 2)
    logits, cache = model_step(draft, pair, cache, first, state.encoded, kernels=kernels)  # (R, 2, V)
    last = ops.where(i - 1 - first > 0, logits[:, 1], logits[:, 0])  # the logits of position i
    drafts, probabilities = [], []
    for k in range(K):
        p = i + k
        at = ops.minimum(p, L - 1)
        if ctx.seed is None:  # greedy
            picked = sampler.get_next_token(last, None)  # (R,)
        else:  # a draw from q, the draft's distribution through the sampler's filters, which the rule reads
            filtered = sampler.filtered_logits(last)  # (R, V)
            probabilities.append(ops.softmax(filtered, axis=-1))
            noise = uniform_noise(ctx.seed, noise_step(p, verify_pass, L, 2), ctx.num_rows)
            picked = sample_categorical(filtered, noise)
        token = ops.where(p < known, column(tokens, at, options.gather_columns), ops.cast(picked, "int32"))
        drafts.append(token)
        if k < K - 1:  # feed it (a position past the buffer writes the last one: a draft's cache, never read wrong)
            logits, cache = model_step(draft, token[:, None], cache, at, state.encoded, kernels=kernels)
            last = logits[:, 0]
    q = ops.stack(probabilities, axis=1) if probabilities else None  # (R, K, V)
    return ops.stack(drafts, axis=1), q, state._replace(cache=loop_cache(cache, options.flat_cache))


def _pair(tokens, first, gather):
    """tokens (R, L)[:, first : first + 2], `first` a scalar tensor."""
    if gather:
        return ops.take(tokens, first + ops.arange(2, dtype="int32"), axis=1)
    return ops.slice(tokens, (0, first), (ops.shape(tokens)[0], 2))
