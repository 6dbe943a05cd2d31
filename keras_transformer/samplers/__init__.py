"""Samplers for `generate`: greedy, random (temperature / top-k / top-p) and beam search.

The decoding core behind them, one job per module: `sampler.py` (the base: token choice only),
`decode_options.py` (the frozen static settings), `processors.py` (logits processors),
`cache_schedule.py` (cache widths and layout), `loop_state.py` (the loop's typed state),
`decode_loop.py` (prefill and step, written once),
`compile.py` (the one backend switch), `decode.py` (runs it), `generate.py` (inputs and outputs).
`trace_prepare` / `trace_run` are the loop for callers that trace it themselves (the SavedModel export).
"""

from keras_transformer.samplers.beam_sampler import BeamSampler
from keras_transformer.samplers.cache_schedule import cache_widths
from keras_transformer.samplers.decode_loop import trace_prepare, trace_run
from keras_transformer.samplers.decode_options import DecodeOptions
from keras_transformer.samplers.generate import LENGTH_BUCKET, PREFILL_BUCKET, generate
from keras_transformer.samplers.greedy_sampler import GreedySampler
from keras_transformer.samplers.random_sampler import RandomSampler, keep_nucleus, keep_top_k, sample_categorical
from keras_transformer.samplers.registry import deserialize, get, serialize
from keras_transformer.samplers.sampler import Sampler

__all__ = [
    "BeamSampler", "DecodeOptions", "GreedySampler", "LENGTH_BUCKET", "PREFILL_BUCKET", "RandomSampler", "Sampler",
    "cache_widths", "deserialize", "generate", "get", "keep_nucleus", "keep_top_k", "sample_categorical",
    "serialize", "trace_prepare", "trace_run",
]
