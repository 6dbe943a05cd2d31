"""StepContext: what a decoding step reads besides the loop state, typed; and the row reorder it offers samplers.

Axes: B inputs, K beams, R = B * K decoded rows, L token buffer length, V vocabulary.

The loop builds one context per traced function (`decode_loop.run` once for the whole loop, a step run
one by one once per step) from the call's `LoopInputs` and static settings. The samplers and logits
processors read it by name; it is their only window on the engine, so they import nothing of it.
"""

from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.decoding.cache_schedule import loop_cache, model_cache
from keras_transformer.decoding.decode_options import DecodeOptions
from keras_transformer.decoding.loop_state import Rows, present
from keras_transformer.kernels.loop_ops import reorder_filled_rows


class StepContext(NamedTuple):
    """Per-call tensors and static settings of the loop (never changed by it)."""

    options: DecodeOptions
    num_rows: Any  # R: an int, or a tensor where the batch is dynamic (the SavedModel's trace)
    batch_size: Any  # B = R // K
    num_beams: int  # K
    length: Any  # L: an int, or a tensor where the buffer is dynamic (the SavedModel's trace)
    vocabulary_size: int  # V
    prompt_lengths: Any  # (R,) int32
    max_new_tokens: Any  # int32 scalar
    limits: Any  # (R,) int32: the position after each row's last token
    min_new_tokens: Any  # int32 scalar
    repetition_penalty: Any  # float32 scalar
    seed: Any  # int32 scalar, or None: no noise (see `sampler.step_noise`)

    @property
    def stop_token_ids(self):
        return self.options.stop_token_ids

    @property
    def pad_id(self):
        return self.options.pad_id

    def reorder_rows(self, rows, index, i):
        """The loop's `Rows` taken in the order `index` (R,) after step i - 1 wrote positions [0, i)."""
        options = self.options
        return reorder_rows(rows, index, filled=i if options.eager_rows else None, flat=options.flat_cache)


def step_context(inputs, options, num_beams, vocabulary_size):
    """The `StepContext` of a call: `inputs` its `LoopInputs` (tensors)."""
    num_rows = ops.shape(inputs.token_ids)[0]
    return StepContext(
        options=options,
        num_rows=num_rows,
        batch_size=num_rows // num_beams,
        num_beams=num_beams,
        length=_length(inputs.token_ids),
        vocabulary_size=vocabulary_size,
        prompt_lengths=inputs.prompt_lengths,
        max_new_tokens=inputs.max_new_tokens,
        limits=inputs.prompt_lengths + inputs.max_new_tokens,
        min_new_tokens=inputs.min_new_tokens,
        repetition_penalty=inputs.repetition_penalty,
        seed=inputs.seed if present(inputs.seed) else None,
    )


def reorder_rows(rows, index, filled=None, flat=True):
    """The loop's per-row tensors (`Rows`: token buffer, cache, ...) with their rows taken in the order `index` (R,).

    filled: None, or the number of cache positions written so far, for steps that run op by op
    (`DecodeOptions.eager_rows`): then only those are reordered, in place (`loop_ops.reorder_filled_rows`).
    flat: the loop's cache layout (`DecodeOptions.flat_cache`).
    """
    num_rows = ops.shape(index)[0]

    def take(value):
        return ops.take(value, index, axis=0)

    reordered = rows._replace(
        **{name: keras.tree.map_structure(take, getattr(rows, name)) for name in Rows._fields if name != "cache"}
    )
    if present(rows.ancestry):  # a beam cache stays in place: the reordered ancestry rows say where each beam reads
        return reordered
    if filled is not None:
        return reordered._replace(cache=reorder_filled_rows(rows.cache, index, filled))
    cache = model_cache(rows.cache, num_rows, flat)
    return reordered._replace(cache=loop_cache([tuple(take(t) for t in pair) for pair in cache], flat))


def _length(token_ids):
    """L of the (R, L) token buffer: static where it is, else a tensor."""
    length = token_ids.shape[1]
    return ops.shape(token_ids)[1] if length is None else length
