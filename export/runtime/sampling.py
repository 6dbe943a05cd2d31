"""The samplers' arithmetic and the noise of random sampling: numpy only.

`Picker` chooses a token per row (greedy, or random as `keras_transformer.samplers.RandomSampler`:
temperature, top-k, top-p, then inverse-CDF sampling); `noise` is the numpy twin of
`keras_transformer/samplers/noise.py` (this file must not import Keras), held equal to it by
tests/samplers/test_noise.py: the same (seed, step, row) gives the same draw in every runtime.
"""

import numpy as np

SAMPLERS = ("greedy", "random", "beam")
NEG = np.float32(-1.0e9)  # score of impossible tokens and beams (finite: no inf - inf)


def check_arguments(max_new_tokens, sampler, num_beams, temperature, top_k, top_p, early_stopping):
    """A `ValueError` naming the first argument of `Generator.generate_ids` that is out of its range."""
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be a positive int. Received: max_new_tokens={max_new_tokens!r}")
    if sampler == "beam":
        if isinstance(num_beams, bool) or not isinstance(num_beams, (int, np.integer)) or num_beams < 1:
            raise ValueError(f"`num_beams` must be a positive int. Received: num_beams={num_beams!r}")
        if early_stopping not in (True, False, "never"):
            raise ValueError(
                f"`early_stopping` must be True, False or 'never'. Received: early_stopping={early_stopping!r}"
            )
    if sampler == "random":
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
            raise ValueError(f"`top_k` must be a positive int or None. Received: top_k={top_k!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"`top_p` must be in (0, 1] or None. Received: top_p={top_p!r}")


class Picker:
    """Chooses one token per row from logits (R, V): greedy, or random as `RandomSampler`."""

    def __init__(self, sampler, temperature, top_k, top_p):
        self.sampler = sampler
        self.temperature = np.float32(temperature)
        self.top_k = top_k
        self.top_p = top_p

    def __call__(self, logits, uniform):
        if self.sampler != "random":
            return np.argmax(logits, axis=-1)
        # Inverse CDF: the first token whose cumulative probability reaches uniform * total.
        probabilities = self.probabilities(logits)
        cdf = np.where(probabilities > 0, np.cumsum(probabilities, axis=-1), np.float32(-1.0))
        target = uniform[:, None] * cdf.max(axis=-1, keepdims=True)
        return np.argmax(cdf >= target, axis=-1)

    def probabilities(self, logits):
        """Logits (R, V) -> the distribution random sampling draws from (R, V): temperature, top-k, top-p."""
        logits = logits.astype(np.float32) / self.temperature
        vocabulary_size = logits.shape[-1]
        if self.top_k is not None and self.top_k < vocabulary_size:
            kth = -np.sort(-logits, axis=-1)[:, self.top_k - 1 : self.top_k]  # the k-th largest logit
            logits = np.where(logits < kth, NEG, logits)
        if self.top_p is not None and self.top_p < 1:
            descending = -np.sort(-logits, axis=-1)
            probabilities = softmax(descending)
            before = np.cumsum(probabilities, axis=-1) - probabilities  # mass of the more likely tokens
            threshold = np.where(before < np.float32(self.top_p), descending, -NEG).min(axis=-1, keepdims=True)
            logits = np.where(logits < threshold, NEG, logits)
        return softmax(logits)


def draw(probabilities, uniform):
    """One token from a distribution (V,) (any positive total) and a uniform number in (0, 1]: the first token
    whose cumulative probability reaches uniform * total; tokens of probability 0 are never drawn."""
    cdf = np.where(probabilities > 0, np.cumsum(probabilities), -1.0)
    return int(np.argmax(cdf >= uniform * cdf.max()))


def speculative_accept(target, drafts, proposal, uniforms):
    """The rejection rule of Leviathan et al. / Chen et al.: which drafts a random sampler keeps, and the token
    after them, so that every token is distributed as the target's own distribution.

    Args:
        target: (T, V) the target's distributions at the T = k + 1 positions checked (`Picker.probabilities`).
        drafts: the k drafted ids, each drawn from its row of `proposal`.
        proposal: (k, V) the draft's distributions they were drawn from.
        uniforms: k + 1 uniform numbers in (0, 1].

    Returns:
        (kept, token): draft i is kept with probability min(1, p_i / q_i) until one is not; the token after the
        kept ones is drawn from max(0, p - q), normalised, at a rejected position, else from p after them all.
    """
    for i, token in enumerate(drafts):
        p, q = target[i, token], proposal[i, token]
        if uniforms[i] * q > p:  # rejected: u > p / q
            residual = np.maximum(target[i] - proposal[i], 0.0)
            # p == q everywhere keeps every draft; round-off may still leave no mass: p itself then.
            return i, draw(residual if residual.sum() > 0 else target[i], uniforms[-1])
    return len(drafts), draw(target[len(drafts)], uniforms[-1])


def softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def log_softmax(logits):
    logits = logits.astype(np.float32, copy=False)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return shifted


def token_logprobs(logits, token, top):
    """One position's raw logits (V,) and the chosen token -> (its log-probability, the `top` most likely
    tokens' ids and log-probabilities, most likely first, ties by id). The log-softmax of the model's own
    logits: before temperature, top-k/top-p and any constraint, as OpenAI and vLLM report them."""
    logprobs = log_softmax(logits[None])[0]  # (V,)
    if top <= 0:
        return float(logprobs[token]), [], []
    top = min(top, logprobs.size)
    best = np.argpartition(-logprobs, top - 1)[:top] if top < logprobs.size else np.arange(logprobs.size)
    best = best[np.lexsort((best, -logprobs[best]))]
    return float(logprobs[token]), best.tolist(), logprobs[best].tolist()


# --- the noise -------------------------------------------------------------------


def _mix(x):
    """lowbias32 on uint32 arrays (multiplications wrap modulo 2**32)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def uniform_noise(seed, step, num_rows):
    """Step `step`'s noise (R,) float32 in (0, 1]: entry r a hash of (seed, step, r) only."""
    return noise(seed, step, np.arange(num_rows, dtype=np.uint32))


def noise(seeds, steps, rows):
    """The noise of (seed, step, row) triples, int arrays or ints broadcast together, float32 in (0, 1].

    `batching.py` draws rows of different seeds and steps in one call (continuous batching).
    """
    h = _mix(np.atleast_1d(np.asarray(seeds, np.int32)).view(np.uint32) ^ np.uint32(0x9E3779B9))  # arrays wrap silently
    h = _mix(h ^ np.atleast_1d(np.asarray(steps, np.int32)).view(np.uint32))
    h = _mix(h ^ np.atleast_1d(np.asarray(rows, np.uint32)))
    return ((h >> np.uint32(8)) + np.uint32(1)).astype(np.float32) * np.float32(2.0**-24)


def seed_to_int32(seed):
    """Any int seed -> the int32 the noise hashes (as `RandomSampler` wraps it)."""
    seed = int(seed) % 2**32
    return seed - 2**32 if seed >= 2**31 else seed
