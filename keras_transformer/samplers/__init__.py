"""Samplers for `generate`: greedy, random (temperature / top-k / top-p) and beam search.

What a user passes to `generate(sampler=...)` or `compile(sampler=...)`, one job per module:
`sampler.py` (the base: token choice only), `greedy_sampler.py`, `random_sampler.py`, `beam_sampler.py`,
`registry.py` (samplers by name), `processors.py` (logits processors), `noise.py` (the per-step noise),
`rows.py` (a column of the token buffer). The decoding engine that runs them is `keras_transformer.decoding`;
it imports the samplers, never the reverse.
"""

import importlib
import warnings

from keras_transformer.samplers.beam_sampler import BeamSampler
from keras_transformer.samplers.greedy_sampler import GreedySampler
from keras_transformer.samplers.random_sampler import RandomSampler, keep_nucleus, keep_top_k, sample_categorical
from keras_transformer.samplers.registry import deserialize, get, serialize
from keras_transformer.samplers.sampler import Sampler

__all__ = [
    "BeamSampler",
    "GreedySampler",
    "RandomSampler",
    "Sampler",
    "deserialize",
    "get",
    "keep_nucleus",
    "keep_top_k",
    "sample_categorical",
    "serialize",
]

# The decoding engine's names, which this package exported before the engine got its own package: still
# readable here, with a DeprecationWarning that says where they live now. Read by name on first use (not
# imported), so that the samplers never import the engine above them.
_MOVED_TO_DECODING = (
    "DecodeOptions",
    "LENGTH_BUCKET",
    "PREFILL_BUCKET",
    "cache_widths",
    "generate",
    "trace_prepare",
    "trace_run",
)


def __getattr__(name):
    if name not in _MOVED_TO_DECODING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"`keras_transformer.samplers.{name}` moved to `keras_transformer.decoding.{name}`; "
        "the old name will be removed in a future release.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("keras_transformer.decoding"), name)
