"""Speculative sampling's acceptance rule (Leviathan et al. 2023, Chen et al. 2023) for drafts copied by prompt
lookup: the token at each position is distributed exactly as the sampler's own.

Axes: R decoded rows, L token buffer length, K draft tokens, V vocabulary.

A draft d proposed with probability q(d) is kept with probability min(1, p(d) / q(d)), p the model's
distribution after the processors and the sampler's temperature, top-k and top-p (transformers applies them
to both distributions); else the token is drawn from max(p - q, 0), renormalised. A copied draft is
certain (q is one-hot at d): d is kept with probability p(d), else the token is drawn from p without d. The
sum over both branches is p: the output's distribution is the model's own, whatever the drafts.

The noise is the counter-based noise of the plain loop (`samplers/noise.py`), two numbers per position
(2p: keep or not, 2p + 1: the draw), so that a seed gives the same tokens on every call and backend.
"""

from keras import ops

from keras_transformer.samplers.noise import uniform_noise
from keras_transformer.samplers.processors import NEG
from keras_transformer.samplers.random_sampler import sample_categorical
from keras_transformer.samplers.rows import column


def sampled_choices(sampler, ctx, scores, hypothesis, s, gather):
    """The token (R,) at each position p_j = s + 1 + j from its processed scores (`scores`, K + 1 x (R, V)):
    the hypothesis' draft where the rule keeps it, else a draw from the residual; at the last position a
    draw from p."""
    chosen = []
    K = len(scores) - 1
    for j, score in enumerate(scores):
        p = s + 1 + j
        logits = sampler.filtered_logits(score)  # (R, V)
        draw = uniform_noise(ctx.seed, 2 * p + 1, ctx.num_rows)  # (R,)
        if j == K:  # after K kept drafts, the model's own token
            chosen.append(ops.cast(sample_categorical(logits, draw), "int32"))
            break
        probabilities = ops.softmax(logits, axis=-1)  # (R, V)
        draft = column(hypothesis, p, gather)  # (R,)
        kept = (
            uniform_noise(ctx.seed, 2 * p, ctx.num_rows) <= ops.take_along_axis(probabilities, draft[:, None], 1)[:, 0]
        )
        residual = ops.where(ops.one_hot(draft, ctx.vocabulary_size) > 0, 0.0, probabilities)  # max(p - q, 0)
        drawn = sample_categorical(ops.where(residual > 0, ops.log(ops.maximum(residual, 1e-30)), NEG), draw)
        chosen.append(ops.where(kept, draft, ops.cast(drawn, "int32")))
    return chosen
