"""Key/value caches of `MultiHeadAttention`: the one module that knows their layouts and writes.

Axes: B batch, K beam slots, R = B * K beam rows, T new tokens, S cache length, H query heads,
Hkv key/value heads, G = H / Hkv, Dh head size.

Every cache has one interface, `cache.attend(attention, q, k, v, index, ...)`: write the new
keys/values (B, T, Hkv, Dh) at positions [index, index + T), attend the queries (B, T, H, Dh)
over the cache, return (output (B, T, H, Dh), scores or None, updated cache). The attention
layer projects and does not ask who called it; the cache kinds:
- `KVCache`: keys and values (B, Hkv, S, Dh), heads before positions (as Hugging Face's
  `past_key_values`). Writes are dynamic update slices (XLA does them in place in a compiled
  loop) or, with `write="where"`, a `where` over the positions for one-token writes (tf2onnx
  converts it to plain Equal/Where nodes; export asks for it).
- `BeamCache`: beam search's slots: each beam writes in its own slot, an ancestry table says
  which slot each earlier position is read from, so choosing beams never copies the cache.
- `PaddedQueryCache`: a one-row step whose single token is padded to T rows (TensorFlow's XLA
  runs one-row products as vector x matrix dots at half speed): only the first token is real.

A layer's cache may also be given in the plain public forms, a (keys, values) pair or one
stacked (B, 2, Hkv, S, Dh) tensor; `as_cache` wraps them and `KVCache.like` returns the
updated cache in the form it came.

A backbone's cache holds L layers' caches, stacked or as a list: `layer_cache_of`, `like_cache`,
`split_cache` and `cache_keys` (at the end) read and write that form, so that a family's step and the
decoding loop need nothing else to handle caches.
"""

from keras import ops

from keras_transformer.layers.masks import causal_mask, mask_to_bias, merge_masks, split_mask


class KVCache:
    """Keys and values of one attention layer, (B, Hkv, S, Dh) each.

    Args:
        keys, values: (B, Hkv, S, Dh) tensors.
        write: "slice" (dynamic update slices) or "where" (one-token writes as a `where`, for export).
    """

    def __init__(self, keys, values, write="slice"):
        if write not in ("slice", "where"):
            raise ValueError(f"`write` must be 'slice' or 'where'. Received: write={write!r}")
        self.keys, self.values, self.write = keys, values, write

    def like(self, original):
        """This cache in the form `original` came in: a KVCache, a (keys, values) pair or a stacked tensor."""
        if isinstance(original, KVCache):
            return self
        if isinstance(original, (list, tuple)):
            return (self.keys, self.values)
        return ops.stack([self.keys, self.values], axis=1)  # 2 x (B, Hkv, S, Dh) -> (B, 2, Hkv, S, Dh)

    def fixed(self):
        """(keys, values) (B, Hkv, S, Dh) to attend as they are (cross-attention)."""
        return self.keys, self.values

    def updated(self, k, v, index):
        """The cache with new keys/values k, v (B, T, Hkv, Dh) written at [index, index + T)."""
        k = ops.transpose(k, (0, 2, 1, 3))  # (B, T, Hkv, Dh) -> (B, Hkv, T, Dh)
        v = ops.transpose(v, (0, 2, 1, 3))
        return KVCache(self._write(self.keys, k, index), self._write(self.values, v, index), self.write)

    def _write(self, buffer, update, index):
        """buffer (B, Hkv, S, Dh) with update (B, Hkv, T, Dh) written at [index, index + T).

        Written through (B * Hkv, S, Dh) views, the shape XLA gives the operands of the attention
        products: XLA then writes the buffer in place, where a write on the 4-D shape made it copy the
        whole buffer at every decoding step.
        """
        length, head_dim = buffer.shape[2], buffer.shape[3]
        heads = update.shape[1]  # static even where the buffer's is not (a dynamic batch: the SavedModel's trace)
        if self.write == "where" or None in (heads, length, head_dim, update.shape[2]):  # or dynamic lengths
            return write(buffer, update, index, axis=2, where=self.write == "where")
        flat = ops.reshape(buffer, (-1, length, head_dim))  # (B, Hkv, S, Dh) -> (B * Hkv, S, Dh)
        flat = write(flat, ops.reshape(update, (-1, update.shape[2], head_dim)), index, axis=1)
        return ops.reshape(flat, (-1, heads, length, head_dim))  # -> (B, Hkv, S, Dh)

    def attend(
        self,
        attention,
        q,
        k,
        v,
        index,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        return_scores=False,
        training=None,
    ):
        """Write k, v at [index, index + T), then attend q over all S positions (see the module docstring)."""
        cache = self.updated(k, v, index)
        query_length, key_length = q.shape[1], cache.keys.shape[2]
        if query_length is None or key_length is None:  # traced with dynamic shapes (export)
            query_length, key_length = ops.shape(q)[1], ops.shape(cache.keys)[2]
        causal = causal_mask(query_length, key_length, index, _window(attention)) if use_causal_mask else None
        mask = merge_masks(*split_mask(attention_mask, q, query_length, key_length), causal)
        output, scores = attention.attend_cached(
            q, cache.keys, cache.values, mask, attention_bias, return_scores, training
        )
        return output, scores, cache


class PaddedQueryCache:
    """Causal self-attention of the first of T query tokens: keys and values (B, Hkv, S, Dh).

    Only the first token is real, at position `index`: only its keys/values are written and only
    it attends. The other rows only make the projections matrix products; they get the real
    row's attention output, so they stay finite, and nothing they compute is written or read.
    """

    real_queries = 1  # the query rows that are positions of the sequence (the rotary's call length counts them)

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def like(self, original):
        return self

    def fixed(self):
        raise _step_only("A padded-query")

    def attend(
        self,
        attention,
        q,
        k,
        v,
        index,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=True,
        return_scores=False,
        training=None,
    ):
        _check_step_call("A padded-query", attention_mask, return_scores, use_causal_mask)
        T = q.shape[1]
        plain = KVCache(self.keys, self.values).updated(k[:, :1], v[:, :1], index)  # only the real token's
        mask = merge_masks(None, None, causal_mask(1, plain.keys.shape[2], index, _window(attention)))  # (1, 1, 1, S)
        if attention_bias is not None:  # (B|1, H, T, S)
            attention_bias = attention_bias[:, :, :1]
        output, _ = attention.attend_cached(q[:, :1], plain.keys, plain.values, mask, attention_bias, False, training)
        output = ops.repeat(output, T, axis=1)  # (B, 1, H, Dh) -> (B, T, H, Dh)
        return output, None, PaddedQueryCache(plain.keys, plain.values)


class BeamCache:
    """Beam search's cache: K slots per input, beams reading earlier positions through an ancestry table.

    Args:
        keys_t: (B, Hkv, Dh, S * K), the keys transposed; position s of slot j at s * K + j.
        values: (B, Hkv, S * K, Dh), the same order.
        ancestry: (B, K, S) int, the slot beam k reads position s from.

    The query rows are R = B * K beams. Beam k writes its new keys/values in its own slot k and
    reads position s < index from slot ancestry[b, k, s], so choosing beams reorders only the
    small ancestry table, never the cache. Every query beam is scored against the keys of all K
    slots of its input, positions of the other slots masked out: K times the attention products
    of a plain cache (small next to the projections at one query per row), and no copy of the
    cache at any step, where reordering it copied every layer's keys and values.
    """

    def __init__(self, keys_t, values, ancestry):
        self.keys_t, self.values, self.ancestry = keys_t, values, ancestry

    def like(self, original):
        return self

    def fixed(self):
        raise _step_only("A beam")

    @property
    def keys(self):
        """Slot 0's keys (B, Hkv, S, Dh): what a caller needing the positions' count reads."""
        _, heads, head_dim, _ = self.keys_t.shape
        _, K, length = self.ancestry.shape
        slots = ops.reshape(self.keys_t, (-1, heads, head_dim, length, K))  # (B, Hkv, Dh, S, K)
        return ops.swapaxes(slots[..., 0], 2, 3)  # slot 0 -> (B, Hkv, S, Dh)

    def attend(
        self,
        attention,
        q,
        k,
        v,
        index,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=True,
        return_scores=False,
        training=None,
    ):
        """q (R, T, H, Dh), new k/v (R, T, Hkv, Dh) at positions [index, index + T) -> (R, T, H, Dh)."""
        _check_step_call("A beam", attention_mask, return_scores, use_causal_mask)
        H, Hkv, Dh = attention.num_heads, attention._kv_heads, attention._head_dim
        G = H // Hkv
        _, K, S = self.ancestry.shape
        batch = ops.shape(self.keys_t)[0]
        T = q.shape[1]

        # One write of the T * K new positions per buffer, on the (B * Hkv, ., .) layout the products
        # read: XLA then writes in place (a write on a 4-D view made it copy the buffers every step).
        k = ops.reshape(k, (batch, K, T, Hkv, Dh))  # (R, T, Hkv, Dh) -> (B, K, T, Hkv, Dh)
        v = ops.reshape(v, (batch, K, T, Hkv, Dh))
        new_keys_t = ops.reshape(ops.transpose(k, (0, 3, 4, 2, 1)), (batch * Hkv, Dh, T * K))  # (B, Hkv, Dh, T, K)
        new_values = ops.reshape(ops.transpose(v, (0, 3, 2, 1, 4)), (batch * Hkv, T * K, Dh))  # (B, Hkv, T, K, Dh)
        flat_keys_t = ops.reshape(self.keys_t, (batch * Hkv, Dh, S * K))  # -> (B * Hkv, Dh, S * K)
        flat_values = ops.reshape(self.values, (batch * Hkv, S * K, Dh))  # -> (B * Hkv, S * K, Dh)
        flat_keys_t = write(flat_keys_t, new_keys_t, index * K, axis=2)
        flat_values = write(flat_values, new_values, index * K, axis=1)

        q = ops.reshape(ops.cast(q, "float32") * attention._scale, (batch, K, T, Hkv, G, Dh))
        q = ops.transpose(q, (0, 3, 4, 1, 2, 5))  # -> (B, Hkv, G, K, T, Dh)
        q = ops.reshape(q, (batch * Hkv, G * K * T, Dh))
        # Keys stored transposed make this a plain (rows x Dh) x (Dh x S * K) product, which XLA on
        # CPU runs several times faster than against (S * K, Dh) keys.
        logits = ops.matmul(q, ops.cast(flat_keys_t, "float32"))  # (B * Hkv, G * K * T, Dh) x (., Dh, S * K)
        logits = attention.cap_logits(ops.reshape(logits, (batch, Hkv, G, K, T, S, K)))  # query beam, position, slot

        # Query beam k, token t reads slot j at position s < index iff ancestry[b, k, s] == j,
        # and its own slot at the new positions up to its own (causal).
        slots = ops.arange(K, dtype="int32")
        earlier = (ops.arange(S, dtype="int32") < index)[:, None]  # (S, 1)
        on_path = ops.cast(self.ancestry, "int32")[:, :, :, None] == slots  # (B, K, S, K): query beam, position, slot
        past = ops.logical_and(on_path, earlier)[:, :, None]  # (B, K, 1, S, K)
        own = (slots[:, None] == slots[None, :])[:, None, :]  # (K, 1, K): query beam == slot
        new = ops.logical_and(own, ops.logical_not(earlier))[None, :, None]  # (1, K, 1, S, K)
        causal = causal_mask(T, S, index, _window(attention))[None, None, :, :, None]  # (1, 1, T, S, 1)
        allowed = ops.logical_and(ops.logical_or(past, new), causal)  # (B, K, T, S, K)
        logits = logits + mask_to_bias(allowed, "float32")[:, None, None]  # (B, 1, 1, K, T, S, K)
        if attention_bias is not None:  # (B|1, H, T, S): relative positions, the same for every slot
            bias = ops.reshape(ops.cast(attention_bias, "float32"), (-1, Hkv, G, 1, T, S, 1))
            logits = logits + bias
        scores = ops.softmax(ops.reshape(logits, (-1, S * K)), axis=-1)  # one row per (b, kv head, g, beam, t)
        if training and attention.dropout > 0:
            scores = attention.dropout_layer(scores, training=training)
        probs = ops.reshape(ops.cast(scores, self.values.dtype), (batch * Hkv, G * K * T, S * K))  # rows per kv head
        output = ops.einsum("nqs,nsk->nqk", probs, flat_values)  # (B * Hkv, G * K * T, Dh)
        output = ops.reshape(output, (batch, Hkv, G, K, T, Dh))
        output = ops.transpose(output, (0, 3, 4, 1, 2, 5))  # -> (B, K, T, Hkv, G, Dh)
        output = ops.reshape(output, (batch * K, T, H, Dh))  # -> (R, T, H, Dh)
        keys_t = ops.reshape(flat_keys_t, (batch, Hkv, Dh, S * K))  # back to the cache's (B, Hkv, ., .) form
        values = ops.reshape(flat_values, (batch, Hkv, S * K, Dh))
        return output, None, BeamCache(keys_t, values, self.ancestry)


def as_cache(cache):
    """A layer's cache in any form -> a cache object (`KVCache` for a pair or a stacked (B, 2, Hkv, S, Dh) tensor)."""
    if isinstance(cache, (KVCache, BeamCache, PaddedQueryCache)):
        return cache
    if isinstance(cache, (list, tuple)):
        return KVCache(cache[0], cache[1])
    return KVCache(cache[:, 0], cache[:, 1])  # (B, 2, Hkv, S, Dh) -> 2 x (B, Hkv, S, Dh)


def write(buffer, update, index, axis, where=False):
    """`buffer` with `update` written at [index, index + T) along its sequence `axis`.

    where: a one-token write as a `where` over the positions (see `KVCache`).
    """
    update = ops.cast(update, buffer.dtype)
    index = ops.cast(index, "int32")
    if where and update.shape[axis] == 1:
        shape = [1] * len(buffer.shape)
        shape[axis] = -1
        positions = ops.reshape(ops.arange(ops.shape(buffer)[axis], dtype="int32"), shape)  # 1 except S at `axis`
        return ops.where(positions == index, update, buffer)
    zero = ops.zeros((), "int32")
    start = [zero] * len(buffer.shape)
    start[axis] = index
    return ops.slice_update(buffer, tuple(start), update)


def _window(attention):
    """The attention layer's sliding window (positions a query sees up to its own), or None."""
    return getattr(attention, "sliding_window", None)


def _step_only(kind):
    return ValueError(f"{kind} cache is written by decoding steps: pass `cache_index`. Received: cache_index=None")


def _check_step_call(kind, attention_mask, return_scores, use_causal_mask):
    if attention_mask is not None or return_scores or not use_causal_mask:
        raise ValueError(
            f"{kind} cache is for causal self-attention steps: no `attention_mask` or `return_attention_scores`. "
            f"Received: attention_mask={attention_mask is not None}, return_attention_scores={return_scores}, "
            f"use_causal_mask={use_causal_mask}"
        )


# --- a backbone's cache: L layers ---------------------------------------------
# A backbone's cache is one (B, L, 2, Hkv, S, Dh) tensor, or a list of L per-layer caches:
# (keys, values) pairs of (B, Hkv, S, Dh) buffers or cache objects (above).
# `generate` carries the list: each layer then writes its own two buffers in place and the
# attention products read them directly, where a stacked form costs XLA a slice copy of every
# layer's keys and values at each step (and a restack of the whole cache). A layer returns its
# cache in the form it came.


def split_cache(cache):
    """(B, L, 2, Hkv, S, Dh) -> list of L (keys, values) pairs of (B, Hkv, S, Dh): the form `generate` carries."""
    return [(cache[:, i, 0], cache[:, i, 1]) for i in range(cache.shape[1])]


def layer_cache_of(cache, i):
    """Layer i's cache: from a list of per-layer caches, or a stacked (B, L, 2, Hkv, S, Dh) tensor."""
    return cache[i] if isinstance(cache, (list, tuple)) else cache[:, i]


def cache_keys(layer_cache):
    """A layer's cache in any form -> keys (B, Hkv, S, Dh) (a beam cache's first slot: its positions are what count)."""
    return as_cache(layer_cache).keys


def like_cache(layer_caches, cache):
    """L per-layer caches -> the form of `cache`: a list, or stacked (B, L, 2, Hkv, S, Dh)."""
    if isinstance(cache, (list, tuple)):
        return list(layer_caches)
    return ops.stack(layer_caches, axis=1)
