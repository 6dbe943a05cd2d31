"""Speculative sampling's acceptance rule (Leviathan et al. 2023, Chen et al. 2023), for drafts copied by prompt
lookup or drawn by a draft model: the token at each position is distributed exactly as the sampler's own.

Axes: R decoded rows, L token buffer length, K draft tokens, V vocabulary.

A draft d proposed with probability q(d) is kept with probability min(1, p(d) / q(d)), p the model's
distribution after the processors and the sampler's temperature, top-k and top-p (transformers applies them
to both distributions); else the token is drawn from max(p - q, 0), renormalised. A copied draft is
certain (q is one-hot at d): d is kept with probability p(d), else the token is drawn from p without d. The
sum over both branches is p: the output's distribution is the model's own, whatever the drafts.

The noise is the counter-based noise of the plain loop (`samplers/noise.py`), three numbers per position and
verify pass (`noise_step`: keep or not, the draw, a draft model's draw), so that a seed gives the same tokens on
every call and backend. Fresh numbers at every pass: a row of a batch may verify a position again after it kept a
draft there (another row stopped the batch short of it), and reusing the numbers it kept with would bias the
second decision.
"""

from keras import ops

from keras_transformer.samplers.noise import uniform_noise
from keras_transformer.samplers.processors import NEG
from keras_transformer.samplers.random_sampler import sample_categorical
from keras_transformer.samplers.rows import column


def noise_step(position, verify_pass, length, use):
    """The noise counter of one position (p), verify pass and use (0: keep or not, 1: the draw, 2: a draft's draw);
    int32 arithmetic wraps, which only renames counters."""
    return 3 * (position + length * verify_pass) + use


def sampled_choices(sampler, ctx, scores, hypothesis, s, gather, draft_probabilities=None, i=None, verify_pass=0):
    """The token (R,) at each position p_j = s + 1 + j from its processed scores (`scores`, K + 1 x (R, V)):
    the hypothesis' draft where the rule keeps it, else a draw from the residual; at the last position a
    draw from p. draft_probabilities: None (certain drafts), or a draft model's q (R, K, V) of the positions
    [i, i + K) (a known position before i is forced: its q is never read)."""
    chosen = []
    K = len(scores) - 1
    for j, score in enumerate(scores):
        p = s + 1 + j
        logits = sampler.filtered_logits(score)  # (R, V)
        draw = uniform_noise(ctx.seed, noise_step(p, verify_pass, ctx.length, 1), ctx.num_rows)  # (R,)
        if j == K:  # after K kept drafts, the model's own token
            chosen.append(ops.cast(sample_categorical(logits, draw), "int32"))
            break
        probabilities = ops.softmax(logits, axis=-1)  # (R, V)
        draft = column(hypothesis, p, gather)  # (R,)
        if draft_probabilities is None:  # q one-hot at the draft
            q = ops.cast(ops.one_hot(draft, ctx.vocabulary_size) > 0, probabilities.dtype)  # (R, V)
        else:
            q = ops.take(draft_probabilities, ops.clip(p - i, 0, K - 1), axis=1)  # (R, K, V) -> (R, V)
        p_draft = ops.take_along_axis(probabilities, draft[:, None], 1)[:, 0]  # (R,)
        q_draft = ops.take_along_axis(q, draft[:, None], 1)[:, 0]
        keep = uniform_noise(ctx.seed, noise_step(p, verify_pass, ctx.length, 0), ctx.num_rows)
        kept = keep * q_draft <= p_draft  # P(kept) = min(1, p(d) / q(d))
        residual = ops.maximum(probabilities - q, 0.0)  # (R, V)
        drawn = sample_categorical(ops.where(residual > 0, ops.log(ops.maximum(residual, 1e-30)), NEG), draw)
        chosen.append(ops.where(kept, draft, ops.cast(drawn, "int32")))
    return chosen
