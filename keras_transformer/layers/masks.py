"""Private mask helpers shared by the attention layers.

Axes: B batch, T query length, S key length, H heads.
A mask is boolean with True meaning "may attend". Masks are turned into an
additive bias with a large negative that is safe in every float dtype, so a
fully masked row gives a finite softmax instead of NaN (uniform in float32, where
-1e9 swamps the scores; the attention layer always builds its bias in float32).
"""

from keras import ops


def causal_mask(query_length, key_length, query_start=None, window=None):
    """Bottom-right aligned causal mask of shape (T, S).

    Query i sits at absolute position `query_start + i` and may attend key j
    iff `j <= query_start + i` (and, with a sliding `window`, `j > query_start + i - window`).
    Without `query_start` the queries are the last T positions of the keys (S - T),
    which is what cached decoding needs.
    """
    if query_start is None:
        query_start = key_length - query_length
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(query_start, "int32")
    key_positions = ops.arange(key_length, dtype="int32")
    # (T, 1) >= (1, S) -> (T, S)
    allowed = ops.greater_equal(query_positions[:, None], key_positions[None, :])
    if window is not None:
        allowed = ops.logical_and(allowed, query_positions[:, None] - key_positions[None, :] < window)
    return allowed


def merge_masks(padding_mask, attention_mask, causal):
    """Combine the optional masks into one boolean mask broadcastable to (B, 1, T, S), or None.

    padding_mask: (B, S) key mask. attention_mask: (B, T, S). causal: (T, S).
    """
    mask = None
    if padding_mask is not None:
        mask = ops.cast(padding_mask, "bool")[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
    if attention_mask is not None:
        full = ops.cast(attention_mask, "bool")[:, None, :, :]  # (B, T, S) -> (B, 1, T, S)
        mask = full if mask is None else ops.logical_and(mask, full)
    if causal is not None:
        causal = causal[None, None, :, :]  # (T, S) -> (1, 1, T, S)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    return mask


def large_negative(dtype):
    """A large negative that survives the dtype: -1e9 in float32, about -3e4 in float16."""
    if str(dtype) == "float16":
        return -3.0e4
    return -1.0e9


def mask_to_bias(mask, dtype):
    """Boolean mask -> additive bias in `dtype` (0 where attending, large negative elsewhere)."""
    return ops.where(mask, ops.zeros((), dtype), ops.full((), large_negative(dtype), dtype))


def split_mask(attention_mask, query, query_length, key_length):
    """Validate a (B, S) or (B, T, S) mask; return (padding_mask, full_mask)."""
    if attention_mask is None:
        return None, None
    shape = tuple(attention_mask.shape)
    batch = query.shape[0]
    if len(shape) == 2:
        expected = (batch, key_length)
    elif len(shape) == 3:
        expected = (batch, query_length, key_length)
    else:
        raise ValueError(
            f"`attention_mask` must have shape (B, S) or (B, T, S). Received: attention_mask.shape={shape}"
        )
    for got, want in zip(shape, expected):
        if isinstance(got, int) and isinstance(want, int) and got != want:
            raise ValueError(
                f"`attention_mask` has shape {shape} but the attention needs {expected} (B batch, T queries, S keys)."
            )
    return (attention_mask, None) if len(shape) == 2 else (None, attention_mask)
