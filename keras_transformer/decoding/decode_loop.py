"""The decoding loop, written once for every backend: prefill, start, one step, the whole loop.

Axes: B inputs, K beams (1 unless beam search), R = B * K decoded rows, L token buffer
(and self-attention cache) length, P prefill length, V vocabulary.

The loop, one compiled function per (sampler settings, options) and input shapes (`decode.py`
compiles it through `compile.py`):
- prefill: the first P prompt positions run through the model at once, filling the cache;
- step i (from the shortest prompt's length): feed token i - 1 at cache index i - 1, get
  the logits of position i, let the sampler pick token i. Rows whose prompt is longer than
  i keep their own prompt token, so ragged (right-padded) prompts need no attention mask:
  position i is written before any query at >= i reads it, so a pad key is never attended.

The loop state is a `loop_state.LoopState`: the per-row tensors (`Rows`: token buffer, cache, and the
seen tokens, logits and beam ancestry where the options ask for them), the encoder's outputs for
seq2seq (`Encoded`) and the sampler's own state (see `Sampler._initial_state`). The loop's inputs are
`decode_inputs.PrefillInputs` and `LoopInputs`; what a step reads besides the state is a `StepContext`.
No function here asks which backend runs: `compile.plan` completes the options for it.
"""

import dataclasses
from typing import Any

import keras
from keras import ops

from keras_transformer.decoding.cache_schedule import cache_width, cache_widths, loop_cache, model_cache, widen
from keras_transformer.decoding.decode_inputs import LoopInputs, PrefillInputs
from keras_transformer.decoding.decode_options import DecodeOptions
from keras_transformer.decoding.loop_state import ABSENT, Encoded, LoopState, Prepared, Rows, present
from keras_transformer.decoding.step_context import step_context
from keras_transformer.layers.kv_cache import BeamCache, PaddedQueryCache, split_cache
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.samplers.processors import process
from keras_transformer.samplers.rows import column, write_column


@dataclasses.dataclass(frozen=True, eq=False)
class LoopSpec:
    """What one compiled loop runs: the task, the sampler and the complete options (all static)."""

    task: Any  # a `CausalLM` or `Seq2SeqLM`
    sampler: Any  # a `Sampler`
    options: DecodeOptions

    def context(self, inputs):
        """The `StepContext` of a call's `LoopInputs`."""
        return step_context(inputs, self.options, self.sampler.num_beams, self.task.backbone.vocabulary_size)


def is_seq2seq(task):
    return hasattr(task, "compute_cross_cache")


def model_step(task, token_ids, cache, index, encoded, head=None, kernels=None):
    """(R, T) ids at positions [index, index + T) -> logits (R, T, V) float32, updated cache.

    head: None, or the task's `decode_head()` made once outside the loop.
    kernels: None (the layers run through Keras), or `TorchKernels` on PyTorch, passed to the
    task's step as its `call_layer`.
    """
    kwargs = {} if head is None else {"head": head}  # a task without `decode_head` need not take `head`
    if kernels is not None:
        kwargs["call_layer"] = kernels
    if is_seq2seq(task):
        return task.call_with_cache(token_ids, cache, index, encoded.cross_cache, encoded.padding_mask, **kwargs)
    return task.call_with_cache(token_ids, cache, index, **kwargs)


def prepare(task, inputs: PrefillInputs, kernels=None):
    """Encode (seq2seq) and prefill the cache, once per input (not per beam): shared by every sampler.

    Returns a `Prepared`.
    """
    batch_size, length = ops.shape(inputs.prompt_token_ids)[0], inputs.prompt_token_ids.shape[1]
    encoded = Encoded()
    if is_seq2seq(task):
        encoder_outputs = task.encode(inputs.encoder_token_ids, inputs.encoder_padding_mask)  # (B, S_enc, D)
        encoded = Encoded(
            cross_cache=split_cache(task.compute_cross_cache(encoder_outputs)),  # L x 2 x (B, Hkv, S_enc, Dh)
            padding_mask=inputs.encoder_padding_mask,
        )
    # Per-layer (keys, values) buffers (B, Hkv, W, Dh), W the first chunk's width (see `cache_widths`):
    # each is written in place at every step.
    prefill = inputs.prefill_token_ids  # (B, P)
    if length is None:  # a dynamic buffer (the SavedModel's trace): one cache as wide as it, never widened
        width = ops.shape(inputs.prompt_token_ids)[1]
    else:
        width = cache_widths(length, prefill.shape[1])[0]  # the first width is the same either way
    _, layers, _, heads, _, head_dim = task.backbone.cache_shape(batch_size, width)
    cache = [
        tuple(ops.zeros((batch_size, heads, width, head_dim), cache_dtype(task)) for _ in range(2))
        for _ in range(layers)
    ]
    if prefill.shape[1] is None:  # a dynamic P (the SavedModel's trace): none for one-token prompts

        def fill(cache=cache):
            return model_step(task, prefill, cache, 0, encoded, kernels=kernels)[1]

        cache = ops.cond(ops.shape(prefill)[1] > 0, fill, lambda: cache)
    elif prefill.shape[1]:
        _, cache = model_step(task, prefill, cache, 0, encoded, kernels=kernels)
    return Prepared(cache, encoded)


def cache_dtype(task):
    """The dtype of the key/value cache: what the model's attention layers compute in (a bfloat16 or
    mixed-precision model keeps a 16-bit cache; its functional task and backbone may say float32)."""
    layers = task.backbone._flatten_layers() if isinstance(task.backbone, keras.layers.Layer) else ()
    for layer in layers:
        if isinstance(layer, MultiHeadAttention):
            return layer.compute_dtype
    return getattr(task, "compute_dtype", "float32")


def start(spec, inputs: LoopInputs, prepared):
    """Loop state from the prepared cache: rows repeated per beam. Returns (i, state)."""
    sampler, options = spec.sampler, spec.options
    ctx = spec.context(inputs)
    # (R, L), a buffer of its own: a compiled PyTorch step whose token buffer aliased its inputs' token_ids
    # (as on a call's first step) would be compiled a second time for that aliasing.
    tokens = ops.copy(inputs.token_ids)
    if options.beam_cache:
        rows = _beam_rows(tokens, prepared.cache, sampler.num_beams, options.flat_cache)
    else:
        rows = Rows(tokens, loop_cache(_per_row(prepared.cache, sampler.num_beams), options.flat_cache))
    rows = rows._replace(
        seen=inputs.seen if options.repetition else ABSENT,  # (R, V) bool: tokens before the first step
        logits=(
            ops.zeros((ctx.num_rows, ctx.length, ctx.vocabulary_size), "float32") if options.return_logits else ABSENT
        ),
    )
    state = LoopState(rows, _per_row(prepared.encoded, sampler.num_beams), sampler._initial_state(ctx))
    return ops.cast(inputs.start, "int32"), state


def _per_row(x, num_beams):
    """(B, ...) -> (R, ...): every beam of an input starts from the same cache and encoder outputs."""
    if num_beams == 1:
        return x
    return keras.tree.map_structure(lambda t: ops.repeat(t, num_beams, axis=0), x)


def _beam_rows(tokens, cache, num_beams, flat):
    """`Rows` of a beam cache: every beam gets its own slot of the prefilled cache and reads only its own
    slot so far (see `kv_cache.BeamCache`)."""
    K = num_beams
    # keys transposed (B, Hkv, Dh, W * K), values (B, Hkv, W * K, Dh): position s of slot j at s * K + j;
    # every slot starts as a copy of the prefill.
    slots = [(ops.repeat(ops.swapaxes(keys, 2, 3), K, axis=3), ops.repeat(values, K, axis=2)) for keys, values in cache]
    ancestry = ops.arange(ops.shape(tokens)[0], dtype="int32") % K  # (R,): row b * K + k is beam k
    width = cache[0][0].shape[2]
    return Rows(tokens, loop_cache(slots, flat), ancestry=ops.repeat(ancestry[:, None], width, axis=1))


def body(spec, ctx, i, state, head=None, kernels=None, refresh=False):
    """One step: feed token i - 1, process the logits of position i, let the sampler write token i.

    refresh: the step at i = N + 1 of a model whose cache goes stale at N (`refresh_after`): it feeds every
    position [0, N + 1) again into an empty cache, as transformers' Phi-3 `generate` does at that step.
    """
    sampler, options = spec.sampler, spec.options
    if refresh:
        logits, rows = _refresh_step(spec, ctx, state, head, kernels)  # (R, V)
    else:
        token = column(state.rows.tokens, i - 1, options.gather_columns)[:, None]  # (R, 1)
        logits, rows = _model_step(spec, ctx, token, i, state, head, kernels)  # (R, V)
    if options.return_logits:
        rows = rows._replace(logits=ops.slice_update(rows.logits, (0, i, 0), logits[:, None, :]))
    scores = process(sampler._prepare_scores(logits), rows, i, ctx)
    state = sampler._step(i, scores, state._replace(rows=rows), ctx)
    if options.repetition:
        rows = state.rows
        written = column(rows.tokens, i, options.gather_columns)
        seen = ops.logical_or(rows.seen, ops.one_hot(written, ctx.vocabulary_size, dtype="int32") > 0)  # (R, V)
        state = state._replace(rows=rows._replace(seen=seen))
    return i + 1, state


def _model_step(spec, ctx, token, i, state, head, kernels):
    """The model's step on token (R, 1) at position i - 1 in the loop's cache layout -> (logits (R, V), rows)."""
    task, options, rows = spec.task, spec.options, state.rows
    if options.beam_cache:
        # Each beam writes position i - 1 in its own slot; the sampler's reorder then moves ancestry rows only.
        own_slot = ops.arange(ctx.num_rows, dtype="int32") % ctx.num_beams  # (R,)
        rows = rows._replace(ancestry=write_column(rows.ancestry, i - 1, own_slot))  # (R, W)
        ancestry = ops.reshape(rows.ancestry, (ctx.batch_size, ctx.num_beams, -1))  # (B, K, W)
        cache = [
            BeamCache(keys_t, values, ancestry)
            for keys_t, values in model_cache(rows.cache, ctx.batch_size, options.flat_cache)
        ]
        logits, cache = model_step(task, token, cache, i - 1, state.encoded, head, kernels)
        cache = [(c.keys_t, c.values) for c in cache]
    elif options.padded_step:
        # The token and a copy of it: only the first is real (see `kv_cache.PaddedQueryCache`);
        # the copy makes every product a two-row matrix product.
        pair = ops.repeat(token, 2, axis=1)  # (R, 1) -> (R, 2)
        cache = [
            PaddedQueryCache(keys, values) for keys, values in model_cache(rows.cache, ctx.num_rows, options.flat_cache)
        ]
        logits, cache = model_step(task, pair, cache, i - 1, state.encoded, head, kernels)  # (R, 2, V)
        cache = [(c.keys, c.values) for c in cache]
    else:
        cache = model_cache(rows.cache, ctx.num_rows, options.flat_cache)
        logits, cache = model_step(task, token, cache, i - 1, state.encoded, head, kernels)
    return logits[:, 0, :], rows._replace(cache=loop_cache(cache, options.flat_cache))  # (R, 1, V) -> (R, V)


def refresh_after(backbone):
    """N: the length past which the backbone's layers compute otherwise, so that a cache written within N goes stale
    once a step passes it (a rotary layer's `long_after`: longrope's long factors), or None (the usual case)."""
    layers = backbone._flatten_layers() if isinstance(backbone, keras.layers.Layer) else ()
    lengths = [layer.long_after for layer in layers if getattr(layer, "long_after", None) is not None]
    return min(lengths) if lengths else None


def _refresh_step(spec, ctx, state, head, kernels):
    """The step at i = N + 1 that computes the cache again: positions [0, N + 1) of every row (all known then:
    prompt or chosen) through the model at once into an empty cache of the loop's width, in the loop's layout
    (a beam's row into its own slot). -> (logits (R, V) of position N, rows)."""
    task, options, rows = spec.task, spec.options, state.rows
    count = refresh_after(task.backbone) + 1
    width = cache_width(state)
    if width is None:  # a dynamic cache (the SavedModel's trace): as wide as the buffer
        width = ops.shape(rows.tokens)[1]
    tokens = rows.tokens[:, :count]  # (R, N + 1)
    _, layers, _, heads, _, head_dim = task.backbone.cache_shape(ctx.num_rows, width)
    empty = [
        tuple(ops.zeros((ctx.num_rows, heads, width, head_dim), cache_dtype(task)) for _ in range(2))
        for _ in range(layers)
    ]
    logits, cache = model_step(task, tokens, empty, 0, state.encoded, head, kernels)  # (R, N + 1, V)
    if options.beam_cache:  # row b * K + k -> slot k of input b: position s of slot k at s * K + k
        K, B = ctx.num_beams, ctx.batch_size

        def slots(t):  # (R, Hkv, W, Dh) -> (B, Hkv, W * K, Dh)
            t = ops.reshape(t, (B, K, heads, width, head_dim))  # (R, ...) -> (B, K, Hkv, W, Dh)
            t = ops.transpose(t, (0, 2, 3, 1, 4))  # -> (B, Hkv, W, K, Dh): slots minor
            return ops.reshape(t, (B, heads, width * K, head_dim))  # -> (B, Hkv, W * K, Dh)

        cache = [(ops.swapaxes(slots(keys), 2, 3), slots(values)) for keys, values in cache]
        own_slot = ops.arange(ctx.num_rows, dtype="int32") % K  # (R,)
        rows = rows._replace(ancestry=ops.repeat(own_slot[:, None], width, axis=1))
    return logits[:, -1, :], rows._replace(cache=loop_cache(cache, options.flat_cache))


def step(spec, inputs: LoopInputs, i, state, kernels=None, refresh=False):
    """One step run on its own (a PyTorch step compiled one by one): `body` with the call's context."""
    return body(spec, spec.context(inputs), i, state, kernels=kernels, refresh=refresh)


def one_step(spec, inputs: LoopInputs, i, state, kernels=None):
    """One step as a one-iteration loop: `i` is then a loop variable, not an argument that
    TensorFlow's XLA bridge takes as a compile-time constant (it compiled a step per position)."""
    first = i
    ctx = spec.context(inputs)

    def cond(i, state):
        return i < first + 1

    def loop_body(i, state):  # no `decode_head()` here: a (D, V) copy per step would cost more than it saves
        return body(spec, ctx, i, state, kernels=kernels)

    return ops.while_loop(cond, loop_body, (i, state))


def run(spec, inputs: LoopInputs, prepared, kernels=None):
    """The whole decoding loop in one traced function: one while loop per cache width."""
    task, sampler = spec.task, spec.sampler
    i, state = start(spec, inputs, prepared)
    ctx = spec.context(inputs)
    head = None  # the task's (D, V) output projection, made once for every step (optional interface)
    # Kernels arrange their own head; a `call_layer` that only changes how the layers are called takes this one.
    if hasattr(task, "decode_head") and (kernels is None or getattr(kernels, "takes_decode_head", False)):
        head = task.decode_head()

    def loop_body(i, state):
        return body(spec, ctx, i, state, head, kernels)

    refresh = refresh_after(task.backbone)
    for width, bound in _chunks(ctx.length, cache_width(state), spec.options.chunked_cache):
        state = widen(state, width)
        # A model whose cache goes stale at N: the chunk holding the step i = N + 1 stops before it, runs that
        # step alone (`_refresh_step`) if the loop reached it, and goes on.
        stops = [bound]
        if refresh is not None and _holds(width, bound, refresh + 1):
            stops, refresh_due = [ops.minimum(bound, refresh + 1), bound], refresh
            refresh = None  # the first chunk that holds the step runs it

        for stop in stops:

            def cond(i, state, stop=stop):
                return ops.logical_and(i < stop, sampler._is_running(state))

            i, state = ops.while_loop(cond, loop_body, (i, state))
            if stop is not bound:
                due = ops.logical_and(ops.equal(i, refresh_due + 1), sampler._is_running(state))
                i, state = ops.cond(
                    due, lambda: body(spec, ctx, i, state, head, kernels, refresh=True), lambda: (i, state)
                )
    return outputs(spec, state)


def _holds(width, bound, i):
    """Whether the chunk of cache width W running the steps below `bound` runs step i (its write at i - 1 fits W);
    a dynamic bound (the SavedModel's one chunk) holds every step."""
    if not isinstance(bound, int):
        return True
    return i < bound and i - 1 < width


def _chunks(length, first_width, chunked):
    """[(cache width W, bound: the steps i < bound run at W)] of a loop over a buffer of length L.

    A dynamic L (a tensor: the SavedModel's trace) is one chunk: its cache is L wide from the start.
    """
    if not isinstance(length, int):
        return [(first_width, length)]
    # the steps i <= W write at i - 1 < W
    return [(width, min(width + 1, length)) for width in cache_widths(length, first_width, chunked)]


def outputs(spec, state):
    """The sampler's outputs, with every step's logits (R, L, V) where the options keep them."""
    result = dict(spec.sampler._outputs(state))
    if present(state.rows.logits):
        result["logits"] = state.rows.logits
    return result


def trace_prepare(task, inputs, call_layer=None):
    """`decode`'s encoder and prefill as a traceable function (no compilation, no backend branch).

    For callers that trace the loop themselves: the SavedModel's `generate` signatures run
    `trace_prepare` then `trace_run` inside a `tf.function`, with the batch dynamic.
    inputs: a `PrefillInputs`. call_layer: None (the layers called through Keras), or how the
    task's step calls its layers (see `backbone.call_layer`).
    """
    return prepare(task, inputs, kernels=call_layer)


def trace_run(task, sampler, options, inputs, prepared, call_layer=None):
    """`decode`'s loop as a traceable function: the sampler's outputs (see `trace_prepare`).

    inputs: a `LoopInputs`; options: a `DecodeOptions`; call_layer: as `trace_prepare`'s (a
    `call_layer` with `takes_decode_head` set gets the task's `decode_head()`, as Keras does).
    """
    return run(LoopSpec(task, sampler, options), inputs, prepared, kernels=call_layer)
