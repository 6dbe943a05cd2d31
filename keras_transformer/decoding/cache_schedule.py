"""The cache schedule of the decoding loop: the widths the key/value cache grows through, and its layout.

Axes: R decoded rows (B inputs x K beams), L token buffer length, W cache width, Hkv key/value heads,
Dh head size.

Attention reads every position of the cache it is given, filled or not. So the loop runs in chunks
of growing cache width W (a static shape each): a chunk runs the steps i <= W (they write at
i - 1 < W), then the cache is padded to the next width. Widths grow by CHUNK up to 4 * CHUNK, then
double, so a 1024-position loop compiles at most five step bodies.
"""

from keras import ops

from keras_transformer.decoding.loop_state import present

CHUNK = 128
# TensorFlow's XLA keeps every chunk's loop state apart (JAX reuses it): each width adds a copy of
# the cache at that width. A cache larger than this grows through two widths only, the first and L,
# where the copies cost more memory than the narrower attention saves time (benchmarks/RESULTS.md,
# "TensorFlow's peak memory").
TENSORFLOW_CHUNKED_CACHE_BYTES = 128 * 2**20


def cache_widths(length, prefill_length, chunked=True):
    """Static cache widths of the loop's chunks, ending at the buffer length L; the first holds the prefill.

    chunked=False: only the first of those widths and L.
    """
    widths, width = [], CHUNK
    while width < length:
        widths.append(width)
        width += CHUNK if width < 4 * CHUNK else width
    widths.append(length)
    widths = [w for w in widths if w >= max(prefill_length, 1)]
    return widths if chunked else sorted({widths[0], length})


def cache_width(state):
    """The width W of the loop state's cache."""
    if present(state.rows.ancestry):
        return state.rows.ancestry.shape[-1]  # (R, W)
    return state.rows.cache[0][0].shape[-2]  # (..., W, Dh) in either layout


def widen(state, width):
    """The loop state with every cache buffer padded from W to `width` positions."""
    current = cache_width(state)
    if current is None or width - current <= 0:  # None: a dynamic width, the buffer's own (never widened)
        return state
    extra = width - current

    def pad(t):
        return ops.pad(t, [(0, 0)] * (len(t.shape) - 2) + [(0, extra), (0, 0)])

    rows = state.rows
    if present(rows.ancestry):  # a beam cache: keys_t (N, Dh, W * K), values (N, W * K, Dh), slots minor
        K = rows.cache[0][0].shape[-1] // rows.ancestry.shape[-1]
        rows = rows._replace(
            cache=[
                (ops.pad(keys_t, [(0, 0), (0, 0), (0, extra * K)]), ops.pad(values, [(0, 0), (0, extra * K), (0, 0)]))
                for keys_t, values in rows.cache
            ],
            ancestry=ops.pad(rows.ancestry, [(0, 0), (0, extra)]),  # (R, W): read only once written
        )
    else:
        rows = rows._replace(cache=[tuple(pad(t) for t in pair) for pair in rows.cache])
    return state._replace(rows=rows)


# Compiled XLA loops carry each layer's keys and values as (R * Hkv, S, Dh), the shape XLA gives
# the operands of the batched attention products; the model reads and writes (R, Hkv, S, Dh) views
# of them. Carried as (R, Hkv, S, Dh), XLA on CPU turned each in-place cache write into a copy of
# the whole buffer at every step (benchmarks/RESULTS.md, "cache layout"). PyTorch carries the model's own shape:
# there a reshape is a view.


def loop_cache(cache, flat):
    """L x 2 x (N, Hkv, S, Dh) -> the loop's layout: L x 2 x (N * Hkv, S, Dh) when `flat`, else unchanged.

    N is R, or B for a beam cache (whose S is W positions x K slots; its keys are transposed).
    """
    if not flat:
        return cache
    return [tuple(ops.reshape(t, (-1, *t.shape[2:])) for t in pair) for pair in cache]


def model_cache(cache, leading, flat):
    """The loop's layout -> L x 2 x (N, Hkv, S, Dh), N = `leading` (R, or B for a beam cache)."""
    if not flat:
        return cache
    return [tuple(ops.reshape(t, (leading, -1, *t.shape[1:])) for t in pair) for pair in cache]
