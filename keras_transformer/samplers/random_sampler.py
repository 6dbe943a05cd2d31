"""RandomSampler: sampling with temperature, top-k and top-p (nucleus) filtering."""

import numbers

import keras
import numpy as np
from keras import ops

from keras_transformer.kernels.loop_ops import first_argmax
from keras_transformer.samplers.noise import seed_to_int32
from keras_transformer.samplers.processors import NEG
from keras_transformer.samplers.sampler import Sampler


@keras.saving.register_keras_serializable(package="keras_transformer")
class RandomSampler(Sampler):
    """Samples the next token from softmax(logits / temperature), optionally restricted.

    Filters apply in Hugging Face's order: temperature, then top-k, then top-p. The
    randomness is one uniform number per row and step, a hash of (seed, step, row)
    computed inside the compiled loop (see `noise.py`); the seed is an input of the loop,
    so the same seed gives the same tokens on every call and every backend, in the
    SavedModel's `generate` and in the ONNX bundle's runner (and the loop is never
    retraced for a new seed).

    Args:
        temperature: float > 0; lower is greedier.
        top_k: int >= 1 or None, keep only the k most likely tokens.
        top_p: float in (0, 1] or None, keep the smallest set of most likely tokens whose
            probability reaches top_p (the nucleus).
        seed: int or None. None draws a new seed from numpy's global generator at every
            call (seeded by `keras.utils.set_random_seed`).

    Example:
    >>> from keras_transformer.models import GPTCausalLM
    >>> lm = GPTCausalLM.from_preset("gpt_stdlib")
    >>> lm.generate(["import", "def add(a, b):"], max_new_tokens=12,
    ...             sampler=RandomSampler(temperature=0.8, top_p=0.9, seed=1))
    ['import...', 'def add(a, b):...']
    """

    def __init__(self, temperature=1.0, top_k=None, top_p=None, seed=None):
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature > 0:
            raise ValueError(f"`temperature` must be a number > 0. Received: temperature={temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
            raise ValueError(f"`top_k` must be an int >= 1 or None. Received: top_k={top_k!r}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
            raise ValueError(f"`top_p` must be in (0, 1] or None. Received: top_p={top_p!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
        self.temperature = float(temperature)
        self.top_k = None if top_k is None else int(top_k)
        self.top_p = None if top_p is None else float(top_p)
        self.seed = None if seed is None else int(seed)

    def get_config(self):
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}

    def draw_seed(self):
        seed = self.seed if self.seed is not None else np.random.randint(2**31)  # a fresh seed per call
        return np.int32(seed_to_int32(seed))

    def get_next_token(self, logits, uniform):
        return sample_categorical(self.filtered_logits(logits), uniform)

    def filtered_logits(self, logits):
        """logits (R, V) -> the logits this sampler draws from: divided by the temperature, the tokens outside
        top-k and top-p set to NEG (speculative decoding's acceptance reads their probabilities)."""
        logits = ops.convert_to_tensor(logits) / self.temperature  # (R, V); numpy logits too
        vocabulary_size = logits.shape[-1]
        if self.top_k is not None and self.top_k < vocabulary_size:
            logits = keep_top_k(logits, self.top_k)
        if self.top_p is not None and self.top_p < 1:
            logits = keep_nucleus(logits, self.top_p)
        return logits


def keep_top_k(logits, k):
    """logits (R, V) with all but the k largest of each row (ties at the k-th kept) set to NEG; k an int or a tensor."""
    kth = ops.top_k(logits, k)[0][:, -1:]  # (R, 1), the k-th largest logit
    return ops.where(logits < kth, NEG, logits)


def keep_nucleus(logits, top_p):
    """logits (R, V) with the tokens outside each row's top-p nucleus set to NEG; top_p a float or a tensor."""
    return ops.where(nucleus(ops.softmax(logits, axis=-1), top_p), logits, NEG)


def nucleus(probabilities, top_p, iterations=40):
    """(R, V) mask of the nucleus: the most likely tokens whose probabilities sum to >= top_p.

    A token is in the nucleus iff the tokens strictly more likely than it hold less than
    top_p. That is every token with probability >= tau, tau the largest threshold whose
    tokens still hold top_p, found by bisection (XLA's sort over V on CPU costs far more than these
    masked sums: benchmarks/RESULTS.md, "top-p by bisection"). Exact unless two probabilities differ by less than
    max_probability * 2**-iterations.
    """
    low = ops.zeros_like(probabilities[:, :1])  # (R, 1): mass(p >= low) >= top_p
    high = ops.amax(probabilities, axis=-1, keepdims=True) * 1.0001 + 1e-30  # mass(p >= high) = 0 < top_p
    for _ in range(iterations):
        middle = (low + high) / 2
        enough = ops.sum(ops.where(probabilities >= middle, probabilities, 0.0), axis=-1, keepdims=True) >= top_p
        low, high = ops.where(enough, middle, low), ops.where(enough, high, middle)
    return probabilities >= low


def sample_categorical(logits, uniform):
    """Inverse-CDF sampling: logits (R, V), uniform (R,) in (0, 1] -> (R,) int32.

    Returns the first token whose cumulative probability reaches uniform * total. Tokens with
    zero probability are excluded from the search, so filtered tokens can never come out.
    """
    probabilities = ops.softmax(logits, axis=-1)  # (R, V)
    cdf = ops.where(probabilities > 0, ops.cumsum(probabilities, axis=-1), -1.0)
    target = ops.cast(uniform, "float32")[:, None] * ops.amax(cdf, axis=-1, keepdims=True)  # (R, 1)
    return first_argmax(ops.cast(cdf >= target, "float32"))  # the first True
