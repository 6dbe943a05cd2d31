"""Sampler base class and the compiled, key/value-cached decoding loop.

Axes: B inputs, K beams (1 unless beam search), R = B * K decoded rows, L token buffer
(and self-attention cache) length, P prefill length, V vocabulary.

The loop, one compiled function per (sampler settings, options) and input shapes:
- prefill: the first P prompt positions run through the model at once, filling the cache;
- step i (from the shortest prompt's length): feed token i - 1 at cache index i - 1, get
  the logits of position i, let the sampler pick token i. Rows whose prompt is longer than
  i keep their own prompt token, so ragged (right-padded) prompts need no attention mask:
  position i is written before any query at >= i reads it, so a pad key is never attended.

This module is the only place with backend checks (with torch_kernels.py, the plain-PyTorch
layer kernels its PyTorch loop passes to the model's step): `jax.jit` (model variables passed as
state through a `keras.StatelessScope`) with `lax.while_loop`, `tf.function(jit_compile=True)`
with `tf.while_loop`, and an eager loop under `torch.no_grad()` on PyTorch.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.kv_cache import BeamCache, PaddedQueryCache
from keras_transformer.models.backbone import split_cache
from keras_transformer.samplers.noise import noise_grid, uniform_noise

# Score of impossible tokens and beams: finite, so that sums never make inf - inf = NaN.
NEG = -1.0e9


class Sampler:
    """Base of the samplers: picks each row's next token from its (processed) logits.

    A sampler overrides `get_next_token`; beam search (`BeamSampler`) also overrides the
    loop hooks `_initial_state`, `_step`, `_is_running` and `_outputs`. Samplers are
    serialisable (`get_config` / `from_config`).
    """

    num_beams = 1
    num_return_sequences = 1
    reorders_rows = False  # True for beam search: rows follow their beams, results come from a store

    def get_next_token(self, logits, uniform):
        """Choose one token per row.

        Args:
            logits: (R, V) float32, after the logits processors.
            uniform: (R,) float32 noise in (0, 1], fresh at every step (see `draw_noise`), or
                None for a sampler that draws no seed (see `draw_seed`).

        Returns:
            (R,) int token ids.
        """
        raise NotImplementedError(f"{type(self).__name__} must define `get_next_token`.")

    def draw_seed(self):
        """The seed of one `generate` call's noise (an int32), or None: deterministic samplers draw none."""
        return None

    def draw_noise(self, shape):
        """The noise one `generate` call reads, (L, R) float32 in (0, 1]: entry [i, r] is
        `uniform_noise(seed, i, R)[r]` (see `noise.py`), computed in the loop; ones without a seed."""
        seed = self.draw_seed()
        if seed is None:
            return np.ones(shape, "float32")
        return ops.convert_to_numpy(noise_grid(seed, shape))

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"

    # --- loop hooks (one token per row) ------------------------------------

    def _prepare_scores(self, logits):
        """Logits (R, V) -> the scores the processors and `_step` work on."""
        return logits

    def _initial_state(self, ctx):
        rows = ctx.num_rows
        return {"done": ops.zeros((rows,), "bool"), "emitted": ops.full((rows,), -1, "int32")}

    def _step(self, i, scores, state, ctx):
        """Write token i of every row; a row is done at a stop token or after max_new_tokens."""
        rows, done = dict(state["rows"]), state["done"]
        picked = ops.cast(self.get_next_token(scores, step_noise(ctx, i)), "int32")  # (R,)
        in_prompt = i < ctx.prompt_lengths  # (R,)
        emitted = ops.logical_and(ops.logical_not(in_prompt), ops.logical_not(done))
        token = ops.where(in_prompt, column(rows["tokens"], i), ops.where(done, ctx.pad_id, picked))
        rows["tokens"] = write_column(rows["tokens"], i, token)
        stopped = ops.logical_and(emitted, is_stop_token(token, ctx.stop_token_ids))
        done = ops.logical_or(ops.logical_or(done, stopped), i + 1 >= ctx.limits)
        return {**state, "rows": rows, "done": done, "emitted": ops.where(emitted, token, -1)}

    def _is_running(self, state):
        return ops.logical_not(ops.all(state["done"]))

    def _outputs(self, state):
        outputs = {"token_ids": state["rows"]["tokens"]}  # (R, L)
        if "logits" in state["rows"]:
            outputs["logits"] = state["rows"]["logits"]  # (R, L, V)
        return outputs

    def _trace_key(self):
        """What the compiled loop depends on: the config without the seed (an input of the loop)."""
        config = {k: v for k, v in self.get_config().items() if k != "seed"}
        return (type(self).__name__, tuple(sorted((k, repr(v)) for k, v in config.items())))


# --- small tensor helpers shared by the samplers ---------------------------


def column(tokens, i):
    """tokens (R, L), scalar i -> tokens[:, i] (R,)."""
    if keras.config.backend() == "torch":
        return ops.take(tokens, i, axis=1)  # eager: a gather costs far less than Keras's slice at a tensor index
    return ops.slice(tokens, (0, i), (ops.shape(tokens)[0], 1))[:, 0]  # compiled: a dynamic slice


def first_argmax(x):
    """x (R, V) -> (R,) int32 index of each row's first maximum (a NaN counts as the maximum, as in argmax).

    Compiled, as the index of the first entry equal to the row's max: two vectorised reductions,
    where XLA on CPU runs `argmax` as a scalar (value, index) reduction, 10x slower at (1, 8000)
    and 3-5x at (8-32, 8000) in a jitted loop. PyTorch's eager loop keeps its one argmax kernel.
    """
    if keras.config.backend() == "torch":
        return ops.cast(ops.argmax(x, axis=-1), "int32")
    size = ops.shape(x)[-1]
    is_max = ops.logical_or(x == ops.max(x, axis=-1, keepdims=True), ops.isnan(x))
    return ops.min(ops.where(is_max, ops.arange(size, dtype="int32")[None, :], size), axis=-1)


def write_column(tokens, i, values):
    """tokens (R, L) with column i replaced by values (R,)."""
    positions = ops.arange(ops.shape(tokens)[1], dtype="int32")[None, :]  # (1, L)
    return ops.where(positions == i, ops.cast(values, tokens.dtype)[:, None], tokens)


def step_noise(ctx, i):
    """The uniform noise of step i (R,) from the call's seed, or None when the sampler draws no seed."""
    if ctx.seed is None:
        return None
    return uniform_noise(ctx.seed, i, ctx.num_rows)


def is_stop_token(tokens, stop_token_ids):
    """Boolean mask of the same shape as `tokens`: which ones are stop tokens (a static tuple)."""
    hit = ops.zeros(ops.shape(tokens), "bool")
    for token_id in stop_token_ids:
        hit = ops.logical_or(hit, tokens == token_id)
    return hit


# --- the loop ---------------------------------------------------------------


class DecodeOptions:
    """Static settings of one compiled loop (part of its cache key)."""

    def __init__(self, stop_token_ids=(), pad_id=0, repetition=False, no_repeat_ngram_size=0,
                 return_logits=False, streaming=False):
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.beam_cache = False  # set by `decode`: beams keep their cache slots, an ancestry table follows them
        self.padded_step = False  # set by `decode`: each step pads its one token to two (see `_body`)
        self.chunked_cache = True  # set by `decode`: the cache grows through every width of `cache_widths`
        self.pad_id = int(pad_id)
        self.repetition = bool(repetition)
        self.no_repeat_ngram_size = int(no_repeat_ngram_size)
        self.return_logits = bool(return_logits)
        self.streaming = bool(streaming)

    def key(self):
        return tuple(sorted(vars(self).items()))


class _Context:
    """Per-call tensors and static settings the loop body reads (never changed by the loop)."""

    def __init__(self, inputs, options, sampler, vocabulary_size):
        # R a tensor where the batch is dynamic (the SavedModel's trace), else an int; L is static.
        self.num_rows, self.length = ops.shape(inputs["token_ids"])[0], inputs["token_ids"].shape[1]
        self.num_beams = sampler.num_beams
        self.batch_size = self.num_rows // self.num_beams
        self.vocabulary_size = vocabulary_size
        self.prompt_lengths = inputs["prompt_lengths"]  # (R,)
        self.max_new_tokens = inputs["max_new_tokens"]  # scalar
        self.limits = self.prompt_lengths + self.max_new_tokens  # (R,) position after each row's last token
        self.min_new_tokens = inputs["min_new_tokens"]
        self.repetition_penalty = inputs["repetition_penalty"]
        self.seed = inputs.get("seed")  # int32 scalar, or None: no noise (see `step_noise`)
        self.stop_token_ids = options.stop_token_ids
        self.pad_id = options.pad_id
        self.options = options


def _is_seq2seq(task):
    return hasattr(task, "compute_cross_cache")


def _model_step(task, token_ids, cache, index, context, head=None, kernels=None):
    """(R, T) ids at positions [index, index + T) -> logits (R, T, V) float32, updated cache.

    head: None, or the task's `decode_head()` made once outside the loop.
    kernels: None (the layers run through Keras), or `TorchKernels` on PyTorch, passed to the
    task's step as its `call_layer`.
    """
    kwargs = {} if head is None else {"head": head}  # a task without `decode_head` need not take `head`
    if kernels is not None:
        kwargs["call_layer"] = kernels
    if _is_seq2seq(task):
        return task.call_with_cache(
            token_ids, cache, index, context["cross_cache"], context["encoder_padding_mask"], **kwargs
        )
    return task.call_with_cache(token_ids, cache, index, **kwargs)


def _prepare(task, inputs, kernels=None):
    """Encode (seq2seq) and prefill the cache, once per input (not per beam): shared by every sampler.

    inputs: prompt_token_ids (B, L), prefill_token_ids (B, P), and for seq2seq
    encoder_token_ids / encoder_padding_mask (B, S_enc). Returns {"cache", "context"}.
    """
    batch_size, length = ops.shape(inputs["prompt_token_ids"])[0], inputs["prompt_token_ids"].shape[1]
    context = {}
    if _is_seq2seq(task):
        encoder_outputs = task.encode(inputs["encoder_token_ids"], inputs["encoder_padding_mask"])  # (B, S_enc, D)
        context = {
            "cross_cache": split_cache(task.compute_cross_cache(encoder_outputs)),  # L x 2 x (B, Hkv, S_enc, Dh)
            "encoder_padding_mask": inputs["encoder_padding_mask"],
        }
    # Per-layer (keys, values) buffers (B, Hkv, W, Dh), W the first chunk's width (see `cache_widths`):
    # each is written in place at every step.
    prefill = inputs["prefill_token_ids"]  # (B, P)
    width = cache_widths(length, prefill.shape[1])[0]  # the first width is the same either way
    _, layers, _, heads, _, head_dim = task.backbone.cache_shape(batch_size, width)
    cache = [
        tuple(ops.zeros((batch_size, heads, width, head_dim), task.compute_dtype) for _ in range(2))
        for _ in range(layers)
    ]
    if prefill.shape[1]:
        _, cache = _model_step(task, prefill, cache, 0, context, kernels=kernels)
    return {"cache": cache, "context": context}


def _start(task, sampler, options, inputs, prepared):
    """Loop state from the prepared cache: rows repeated per beam. Returns (i, state)."""
    ctx = _Context(inputs, options, sampler, task.backbone.vocabulary_size)
    tokens = inputs["token_ids"]  # (R, L)
    num_rows, length = ops.shape(tokens)[0], tokens.shape[1]

    def per_row(x):  # (B, ...) -> (R, ...): every beam of an input starts from the same cache and encoder
        if sampler.num_beams == 1:
            return x
        return keras.tree.map_structure(lambda t: ops.repeat(t, sampler.num_beams, axis=0), x)

    if options.beam_cache:
        # Every beam gets its own slot of the prefilled cache and reads only its own slot so far.
        K = sampler.num_beams
        # keys transposed (B, Hkv, Dh, W * K), values (B, Hkv, W * K, Dh): position s of slot j at s * K + j
        # (see `kv_cache.BeamCache`); every slot starts as a copy of the prefill.
        slots = [
            (ops.repeat(ops.swapaxes(keys, 2, 3), K, axis=3), ops.repeat(values, K, axis=2))
            for keys, values in prepared["cache"]
        ]
        ancestry = ops.arange(num_rows, dtype="int32") % K  # (R,): row b * K + k is beam k
        width = prepared["cache"][0][0].shape[2]
        rows = {"tokens": tokens, "cache": _loop_cache(slots), "ancestry": ops.repeat(ancestry[:, None], width, axis=1)}
    else:
        rows = {"tokens": tokens, "cache": _loop_cache(per_row(prepared["cache"]))}
    if options.repetition:
        rows["seen"] = inputs["seen"]  # (R, V) bool: tokens before the first step
    if options.return_logits:
        rows["logits"] = ops.zeros((num_rows, length, ctx.vocabulary_size), "float32")
    context = {name: per_row(value) for name, value in prepared["context"].items()}
    state = {"rows": rows, "context": context, **sampler._initial_state(ctx)}
    return ops.cast(inputs["start"], "int32"), state


def _body(task, sampler, options, inputs, i, state, head=None, kernels=None):
    """One step: feed token i - 1, process the logits of position i, let the sampler write token i."""
    ctx = _Context(inputs, options, sampler, task.backbone.vocabulary_size)
    rows = dict(state["rows"])
    token = column(rows["tokens"], i - 1)[:, None]  # (R, 1)
    if options.beam_cache:
        # Each beam writes position i - 1 in its own slot; the sampler's reorder then moves ancestry rows only.
        own_slot = ops.arange(ctx.num_rows, dtype="int32") % ctx.num_beams  # (R,)
        rows["ancestry"] = write_column(rows["ancestry"], i - 1, own_slot)  # (R, W)
        ancestry = ops.reshape(rows["ancestry"], (ctx.batch_size, ctx.num_beams, -1))  # (B, K, W)
        cache = [BeamCache(keys_t, values, ancestry) for keys_t, values in _model_cache(rows["cache"], ctx.batch_size)]
        logits, cache = _model_step(task, token, cache, i - 1, state["context"], head, kernels)
        rows["cache"] = _loop_cache([(c.keys_t, c.values) for c in cache])
    elif options.padded_step:
        # The token and a copy of it: only the first is real (see `kv_cache.PaddedQueryCache`);
        # the copy makes every product a two-row matrix product.
        pair = ops.repeat(token, 2, axis=1)  # (R, 1) -> (R, 2)
        cache = [PaddedQueryCache(keys, values) for keys, values in _model_cache(rows["cache"], ctx.num_rows)]
        logits, cache = _model_step(task, pair, cache, i - 1, state["context"], head, kernels)  # (R, 2, V)
        rows["cache"] = _loop_cache([(c.keys, c.values) for c in cache])
    else:
        cache = _model_cache(rows["cache"], ctx.num_rows)
        logits, cache = _model_step(task, token, cache, i - 1, state["context"], head, kernels)
        rows["cache"] = _loop_cache(cache)
    logits = logits[:, 0, :]  # (R, 1, V) -> (R, V)
    if options.return_logits:
        rows["logits"] = ops.slice_update(rows["logits"], (0, i, 0), logits[:, None, :])
    scores = _process(sampler._prepare_scores(logits), rows, i, ctx)
    state = sampler._step(i, scores, {**state, "rows": rows}, ctx)
    if options.repetition:
        rows = dict(state["rows"])
        written = ops.one_hot(column(rows["tokens"], i), ctx.vocabulary_size, dtype="int32") > 0  # (R, V)
        rows["seen"] = ops.logical_or(rows["seen"], written)
        state = {**state, "rows": rows}
    return i + 1, state


# The compiled loops carry each layer's keys and values as (R * Hkv, S, Dh), the shape XLA gives
# the operands of the batched attention products; the model reads and writes (R, Hkv, S, Dh)
# views of them. Carried as (R, Hkv, S, Dh), XLA on CPU turned each in-place cache write into a
# copy of the whole buffer at every step (a loop of one layer's write and attention at 576
# positions: 165 us per step, against 26 us carried this way). PyTorch's eager loop carries the
# model's own shape: there a reshape is a view, and each Keras op costs Python time per step.


def _loop_cache(cache):
    """L x 2 x (N, Hkv, S, Dh) -> L x 2 x (N * Hkv, S, Dh), the compiled loops' layout.

    N is R, or B for a beam cache (whose S is W positions x K slots; its keys are transposed).
    """
    if keras.config.backend() == "torch":
        return cache
    return [tuple(ops.reshape(t, (-1, *t.shape[2:])) for t in pair) for pair in cache]


def _model_cache(cache, leading):
    """The loop's layout -> L x 2 x (N, Hkv, S, Dh), N = `leading` (R, or B for a beam cache)."""
    if keras.config.backend() == "torch":
        return cache
    return [tuple(ops.reshape(t, (leading, -1, *t.shape[1:])) for t in pair) for pair in cache]


def reorder_rows(rows, index, filled=None):
    """The loop's per-row state (token buffer, cache, ...) with its rows taken in the order `index` (R,).

    filled: None, or the number of cache positions written so far (the rest is written before it is
    read): PyTorch's eager loop then reorders only those, in place.
    """
    num_rows = ops.shape(index)[0]

    def take(value):
        return ops.take(value, index, axis=0)

    reordered = {name: keras.tree.map_structure(take, value) for name, value in rows.items() if name != "cache"}
    if "ancestry" in rows:  # a beam cache stays in place: the reordered ancestry rows say where each beam reads
        reordered["cache"] = rows["cache"]
        return reordered
    if filled is not None and keras.config.backend() == "torch":
        # A copy of the written positions only, into the same buffers: no new (R, Hkv, S, Dh) buffer per
        # layer and step, and on average half the positions of the chunk's width.
        n, rows_index = int(filled), ops.convert_to_tensor(index).long()
        cache = []
        for pair in rows["cache"]:
            pair = tuple(t if t.is_contiguous() else t.contiguous() for t in pair)  # rows may be broadcast views
            for t in pair:  # (R, Hkv, S, Dh)
                t[:, :, :n] = t[:, :, :n].index_select(0, rows_index)
            cache.append(pair)
        reordered["cache"] = cache
        return reordered
    cache = _model_cache(rows["cache"], num_rows)
    reordered["cache"] = _loop_cache([tuple(take(t) for t in pair) for pair in cache])
    return reordered


def _process(scores, rows, i, ctx):
    """The logits processors, in Hugging Face's order: repetition penalty, n-gram ban, min length."""
    options = ctx.options
    if options.repetition:
        penalty = ctx.repetition_penalty
        penalized = ops.where(scores < 0, scores * penalty, scores / penalty)
        scores = ops.where(rows["seen"], penalized, scores)
    if options.no_repeat_ngram_size:
        banned = banned_ngram_tokens(rows["tokens"], i, options.no_repeat_ngram_size, ctx.vocabulary_size)
        scores = ops.where(banned, NEG, scores)
    if ctx.stop_token_ids:
        too_early = (i - ctx.prompt_lengths) < ctx.min_new_tokens  # (R,) fewer than min_new_tokens so far
        stop = is_stop_token(ops.arange(ctx.vocabulary_size, dtype="int32"), ctx.stop_token_ids)  # (V,)
        scores = ops.where(ops.logical_and(too_early[:, None], stop[None, :]), NEG, scores)
    return scores


def banned_ngram_tokens(tokens, i, n, vocabulary_size):
    """(R, V) mask of the tokens that would repeat an n-gram already in tokens[:, :i].

    Token v is banned at position i when some earlier n-gram tokens[j : j + n] (ending before
    i) starts with the last n - 1 tokens tokens[i - n + 1 : i] and ends with v.
    """
    num_rows, length = tokens.shape
    starts = ops.arange(length, dtype="int32")  # j
    match = ops.logical_and(starts + n - 1 < i, i - n + 1 >= 0)[None, :]  # (1, L)
    padded = ops.pad(tokens, ((0, 0), (0, n)))  # (R, L + n): tokens[:, j + k] exists for every j
    for k in range(n - 1):
        earlier = padded[:, k : k + length]  # (R, L): tokens[:, j + k]
        current = column(padded, ops.maximum(i - n + 1 + k, 0))[:, None]  # (R, 1)
        match = ops.logical_and(match, earlier == current)
    following = padded[:, n - 1 : n - 1 + length]  # (R, L): tokens[:, j + n - 1]
    # Scatter the matches into (R, V + 1); non-matches land in the extra column V.
    target = ops.where(match, following, vocabulary_size)  # (R, L)
    row_index = ops.broadcast_to(ops.arange(num_rows, dtype="int32")[:, None], (num_rows, length))
    indices = ops.stack([ops.reshape(row_index, (-1,)), ops.reshape(target, (-1,))], axis=1)  # (R * L, 2)
    banned = ops.scatter_update(
        ops.zeros((num_rows, vocabulary_size + 1), "int32"), indices, ops.ones((num_rows * length,), "int32")
    )
    return banned[:, :vocabulary_size] > 0


# Attention reads every position of the cache it is given, filled or not. So the loop runs in
# chunks of growing cache width W (a static shape each): a chunk runs the steps i <= W (they
# write at i - 1 < W), then the cache is padded to the next width. Widths grow by CHUNK up to
# 4 * CHUNK, then double, so a 1024-position loop compiles at most five step bodies.
CHUNK = 128
# TensorFlow's loop grows a cache larger than this through two widths only, the first and L: there
# the chunks' cache copies cost more memory than their narrower attention saves time (smollm2_135m,
# batch 8 x 1024 positions, a 360 MiB cache: peak RSS 3.56 GB through five widths, 2.70 GB through
# two; the generate benchmark's GPT at batch 1 x 576 positions, a 2.3 MiB cache: 17% slower through
# two). See RESULTS.
TENSORFLOW_CHUNKED_CACHE_BYTES = 128 * 2**20


def cache_widths(length, prefill_length, chunked=True):
    """Static cache widths of the loop's chunks, ending at the buffer length L; the first holds the prefill.

    chunked=False: only the first of those widths and L (what TensorFlow's Keras loop runs, see `decode`).
    """
    widths, width = [], CHUNK
    while width < length:
        widths.append(width)
        width += CHUNK if width < 4 * CHUNK else width
    widths.append(length)
    widths = [w for w in widths if w >= max(prefill_length, 1)]
    return widths if chunked else sorted({widths[0], length})


def _cache_width(state):
    if "ancestry" in state["rows"]:
        return state["rows"]["ancestry"].shape[-1]  # (R, W)
    return state["rows"]["cache"][0][0].shape[-2]  # (..., W, Dh) in either layout


def _widen(state, width):
    """The loop state with every cache buffer padded from W to `width` positions."""
    extra = width - _cache_width(state)
    if extra <= 0:
        return state

    def pad(t):
        return ops.pad(t, [(0, 0)] * (len(t.shape) - 2) + [(0, extra), (0, 0)])

    rows = dict(state["rows"])
    if "ancestry" in rows:  # a beam cache: keys_t (N, Dh, W * K), values (N, W * K, Dh), slots minor
        K = rows["cache"][0][0].shape[-1] // rows["ancestry"].shape[-1]
        rows["cache"] = [
            (ops.pad(keys_t, [(0, 0), (0, 0), (0, extra * K)]), ops.pad(values, [(0, 0), (0, extra * K), (0, 0)]))
            for keys_t, values in rows["cache"]
        ]
        rows["ancestry"] = ops.pad(rows["ancestry"], [(0, 0), (0, extra)])  # (R, W): read only once written
    else:
        rows["cache"] = [tuple(pad(t) for t in pair) for pair in rows["cache"]]
    return {**state, "rows": rows}


def _one_step(task, sampler, options, inputs, i, state, kernels=None):
    """One step as a one-iteration loop: `i` is then a loop variable, not an argument that
    TensorFlow's XLA bridge takes as a compile-time constant (it compiled a step per position)."""
    first = i

    def cond(i, state):
        return i < first + 1

    def body(i, state):  # no `decode_head()` here: a (D, V) copy per step would cost more than it saves
        return _body(task, sampler, options, inputs, i, state, kernels=kernels)

    return ops.while_loop(cond, body, (i, state))


def _run(task, sampler, options, inputs, prepared, kernels=None):
    """The whole decoding loop in one traced function: one while loop per cache width."""
    i, state = _start(task, sampler, options, inputs, prepared)
    length = inputs["token_ids"].shape[1]
    head = None  # the task's (D, V) output projection, made once for every step (optional interface)
    if kernels is None and hasattr(task, "decode_head"):  # the kernels arrange their own head
        head = task.decode_head()

    def body(i, state):
        return _body(task, sampler, options, inputs, i, state, head, kernels)

    for width in cache_widths(length, _cache_width(state), options.chunked_cache):
        state = _widen(state, width)
        bound = min(width + 1, length)  # the steps i <= width write at i - 1 < width

        def cond(i, state, bound=bound):
            return ops.logical_and(i < bound, sampler._is_running(state))

        i, state = ops.while_loop(cond, body, (i, state))
    return sampler._outputs(state)


def trace_prepare(task, inputs):
    """`decode`'s encoder and prefill as a traceable function (no compilation, no backend branch).

    For callers that trace the loop themselves: the SavedModel's `generate` signatures run
    `trace_prepare` then `trace_run` inside a `tf.function`, with the batch dynamic.
    """
    return _prepare(task, inputs)


def trace_run(task, sampler, options, inputs, prepared):
    """`decode`'s loop as a traceable function: the sampler's outputs (see `trace_prepare`)."""
    return _run(task, sampler, options, inputs, prepared)


# --- compilation, per backend ------------------------------------------------


class _Compiled:
    """A function of tensors compiled for the current backend; counts its traces."""

    def __init__(self, task, fn):
        self.traces = 0

        def traced(*args):
            self.traces += 1
            return fn(*args)

        backend = keras.config.backend()
        if backend == "jax":
            import jax

            variables = list(task.trainable_variables) + list(task.non_trainable_variables)

            @jax.jit
            def stateless(values, *args):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return traced(*args)

            self._call = lambda *args: stateless([v.value for v in variables], *args)
        elif backend == "tensorflow":
            import tensorflow as tf

            self._call = tf.function(traced, jit_compile=True, autograph=False, reduce_retracing=False)
        elif backend == "torch":
            import torch

            def eager(*args):
                with torch.no_grad():
                    return traced(*args)

            self._call = eager
        else:
            self._call = traced

    def __call__(self, *args):
        return self._call(*args)


def _compiled(task, key, build):
    # A compiled function holds the task's variables: when they change (LoRA enabled or merged,
    # weights quantized), every function is made anew, once.
    variables = tuple(map(id, getattr(task, "variables", ())))
    if task.__dict__.get("_generate_variables") != variables:
        object.__setattr__(task, "_generate_functions", {})
        object.__setattr__(task, "_generate_variables", variables)
    functions = task.__dict__["_generate_functions"]
    if key not in functions:
        functions[key] = _Compiled(task, build())
    return functions[key]


def decode(task, sampler, options, inputs, streamer=None):
    """Run the compiled prefill and loop on numpy `inputs`; returns the sampler's outputs as numpy.

    Args:
        task: a `CausalLM` or `Seq2SeqLM`.
        sampler: a `Sampler`.
        options: `DecodeOptions`.
        inputs: dict of numpy arrays. Per input: prompt_token_ids (B, L), prefill_token_ids
            (B, P), and encoder_token_ids / encoder_padding_mask (B, S_enc) for seq2seq. Per row
            (R = B * num_beams): token_ids (R, L), prompt_lengths (R,), seen (R, V) with a
            repetition penalty. Scalars: start, max_new_tokens, min_new_tokens, seed (samplers with noise),
            repetition_penalty.
        streamer: None, or a callable receiving after every step the (R,) numpy array of
            the token each row produced (-1 where a row produced none).
    """
    # TensorFlow's XLA rewrites every product of a one-token, one-row step into a vector x matrix
    # dot and runs it at half the speed of a two-row product (greedy, 4 layers, d 256 on CPU: 0.96
    # vs 0.49 ms per step). A one-row loop there pads each step's token to two (see `_body`).
    options.padded_step = (
        keras.config.backend() == "tensorflow" and not sampler.reorders_rows and len(inputs["token_ids"]) == 1
    )
    # TensorFlow's XLA keeps every chunk's loop state apart (JAX reuses it): each cache width adds a
    # copy of the cache at that width. With a large cache those copies dominate memory, so its loop
    # then grows the cache once, from the first width to L (see `TENSORFLOW_CHUNKED_CACHE_BYTES`).
    rows, length = inputs["token_ids"].shape
    bits = int("".join(c for c in str(task.compute_dtype) if c.isdigit()))  # float32 -> 32, bfloat16 -> 16
    cache_bytes = int(np.prod(task.backbone.cache_shape(rows, length))) * bits // 8
    options.chunked_cache = keras.config.backend() != "tensorflow" or cache_bytes <= TENSORFLOW_CHUNKED_CACHE_BYTES
    inputs = {k: ops.convert_to_tensor(v) for k, v in inputs.items()}
    kernels = None
    if keras.config.backend() == "torch":
        from keras_transformer.samplers import torch_kernels

        # Made per call: the kernels read the weights now, so a call after training sees the new ones.
        kernels = torch_kernels.TorchKernels() if torch_kernels.supports(task) else None
    # Compiled loops: beams keep their cache slots (no copy of the cache per step). PyTorch's eager
    # loop keeps reordering cache rows: its kernels read (R, Hkv, S, Dh) caches.
    options.beam_cache = sampler.num_beams > 1 and keras.config.backend() != "torch"
    return _decode(task, sampler, options, inputs, streamer, kernels)


def _decode(task, sampler, options, inputs, streamer, kernels):
    prepare_names = ("prompt_token_ids", "prefill_token_ids", "encoder_token_ids", "encoder_padding_mask")
    prepare_inputs = {k: v for k, v in inputs.items() if k in prepare_names}
    loop_inputs = {k: v for k, v in inputs.items() if k not in prepare_names}
    # The kernels are an argument (PyTorch's eager calls only): they are made anew for every call.
    prepared = _compiled(task, ("prepare",), lambda: lambda x, k: _prepare(task, x, k))(prepare_inputs, kernels)
    key = (sampler._trace_key(), options.key())
    if streamer is None:
        run = _compiled(task, ("run",) + key, lambda: lambda x, p, k: _run(task, sampler, options, x, p, k))
        outputs = run(loop_inputs, prepared, kernels)
    else:
        start = _compiled(task, ("start",) + key, lambda: lambda x, p: _start(task, sampler, options, x, p))
        step = _compiled(
            task, ("step",) + key, lambda: lambda x, i, s, k: _one_step(task, sampler, options, x, i, s, k)
        )
        length = inputs["token_ids"].shape[1]
        i, state = start(loop_inputs, prepared)
        widths = cache_widths(length, _cache_width(state), options.chunked_cache)
        while (position := int(ops.convert_to_numpy(i))) < length and bool(
            ops.convert_to_numpy(sampler._is_running(state))
        ):
            state = _widen(state, next(w for w in widths if w >= position))  # step i writes at i - 1
            i, state = step(loop_inputs, i, state, kernels)
            emitted = ops.convert_to_numpy(state["emitted"])
            if np.any(emitted >= 0):
                streamer(emitted)
        outputs = sampler._outputs(state)
    return {k: ops.convert_to_numpy(v) for k, v in outputs.items()}
