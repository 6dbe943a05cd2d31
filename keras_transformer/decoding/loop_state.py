"""The decoding loop's state, typed: named tuples of tensors that every backend's loop carries as they are.

Axes: B inputs, K beams (1 unless beam search), R = B * K decoded rows, L token buffer length,
W cache width, V vocabulary, S_enc encoder length, Hkv key/value heads, Dh head size.

Named tuples are structures to `tf.while_loop`, `jax.lax.while_loop`, `torch.compile` and `keras.tree`
alike, so the compiled loops take them with no conversion. A field the options do not ask for holds
`ABSENT`, the empty tuple: a structure with no tensors, which every backend's loop carries for free
(None is not a loop variable on TensorFlow).
"""

from typing import Any, NamedTuple

ABSENT = ()


def present(value):
    """Whether an optional field holds tensors (is not `ABSENT`)."""
    return not (isinstance(value, tuple) and not value)


class Encoded(NamedTuple):
    """What a seq2seq model's encoder hands every step; `ABSENT` fields for a decoder-only model."""

    cross_cache: Any = ABSENT  # per layer (keys, values), each (N, Hkv, S_enc, Dh); N = B, or R in the loop
    padding_mask: Any = ABSENT  # (N, S_enc) bool


class Prepared(NamedTuple):
    """The prefill's result, once per input (not per beam)."""

    cache: Any  # per layer (keys, values), each (B, Hkv, W, Dh)
    encoded: Encoded


class Rows(NamedTuple):
    """Per-row tensors, R rows first: beam search reorders all of them after the chosen beams."""

    tokens: Any  # (R, L) int32: prompt, then the tokens written so far
    cache: Any  # per layer (keys, values) in the loop's layout (`cache_schedule.loop_cache`)
    seen: Any = ABSENT  # (R, V) bool: tokens seen so far (a repetition penalty)
    logits: Any = ABSENT  # (R, L, V) float32: every step's logits (`return_logits`)
    ancestry: Any = ABSENT  # (R, W) int32: the beam slot each position is read from (a beam cache)


class LoopState(NamedTuple):
    """Everything the loop carries from step to step."""

    rows: Rows
    encoded: Encoded  # repeated per beam: (R, ...)
    sampler: Any  # the sampler's own state, a named tuple the sampler defines (`Sampler._initial_state`)
