"""The inputs of one decoding call, typed: what `generate` hands the compiled prefill and loop.

Axes: B inputs, K beams, R = B * K decoded rows, L token buffer length, P prefill length,
S_enc encoder length, V vocabulary.

Like the loop state (`loop_state.py`), these are named tuples, so that every backend's compiler takes
them as they are; a field a call does not use holds `ABSENT`. `generate` fills them with numpy arrays,
`decode` turns every array into a tensor, and the loop reads them by name.
"""

from typing import Any, NamedTuple

from keras_transformer.decoding.loop_state import ABSENT


class PrefillInputs(NamedTuple):
    """Per input: what the encoder (seq2seq) and the prefill read, once per input (not per beam)."""

    prompt_token_ids: Any  # (B, L) int32: each input's prompt, right-padded
    prefill_token_ids: Any  # (B, P) int32: the positions the prefill runs at once
    encoder_token_ids: Any = ABSENT  # (B, S_enc) int32: the sources of a seq2seq model
    encoder_padding_mask: Any = ABSENT  # (B, S_enc) bool


class LoopInputs(NamedTuple):
    """Per row and per call: what the step loop reads (never changed by it)."""

    token_ids: Any  # (R, L) int32: the prompt of every row (repeated per beam), right-padded
    prompt_lengths: Any  # (R,) int32
    start: Any  # int32 scalar: the first step, the shortest prompt's length
    max_new_tokens: Any  # int32 scalar
    min_new_tokens: Any  # int32 scalar
    repetition_penalty: Any  # float32 scalar, applied where `DecodeOptions.repetition`
    seen: Any = ABSENT  # (R, V) bool: the tokens before the first step (a repetition penalty)
    seed: Any = ABSENT  # int32 scalar: the noise seed of a sampler that draws one (see `noise.py`)


class DecodeInputs(NamedTuple):
    """One decoding call's inputs."""

    prefill: PrefillInputs
    loop: LoopInputs
