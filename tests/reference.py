"""Plain-numpy reference implementations: the project's ground truth.

Everything here is float64 numpy, written straight from the papers (Vaswani et al. 2017,
Raffel et al. 2020 for T5's relative position buckets) and the layers' API spec, without
looking at the layers under test. Weights come in as plain dicts of numpy arrays, with
the shapes the layers use, so a test can read a layer's weights and feed them here.

Axes: B batch, T query length, S key length, H heads, Hkv key/value heads, Dh head size,
D model width, F feed-forward width.

Weight dicts:
- attention: query_kernel (D, H, Dh), key_kernel (D, Hkv, Dh), value_kernel (Dv, Hkv, Dh),
  output_kernel (H, Dh, D), and optionally query_bias (H, Dh), key_bias / value_bias (Hkv, Dh),
  output_bias (D,). H, Hkv and Dh are read from the kernel shapes.
- layer norm: gamma (D,), beta (D,); RMS norm: scale (D,).
- feed-forward: intermediate_kernel (D, F), output_kernel (F, D), gate_kernel (D, F) for gated
  activations, and optionally intermediate_bias (F,), gate_bias (F,), output_bias (D,).
- blocks: {"self_attention": attention, "self_attention_norm": norm,
           "cross_attention": attention, "cross_attention_norm": norm (decoder with cross-attention),
           "feed_forward": feed-forward, "feed_forward_norm": norm}.
"""

import functools
import math

import numpy as np

# Added to masked logits. Large enough that exp() underflows to exactly 0 next to any real
# logit, finite so that a fully masked row gives a uniform (finite) distribution.
MASK_VALUE = -1e9


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def softmax(x, axis=-1):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


# ----------------------------------------------------------------------------- masks


def padding_to_attention_mask(padding_mask, query_length):
    """(B, S) key padding mask (1 = real token) -> (B, T, S) boolean mask."""
    padding_mask = np.asarray(padding_mask).astype(bool)
    return np.repeat(padding_mask[:, None, :], query_length, axis=1)


def causal_mask(query_length, key_length, query_start=None):
    """(T, S) boolean mask, True where query i may attend key j.

    Without query_start it is bottom-right aligned: j <= i + (S - T), so the last query sees
    every key. With query_start (the cache index of the first query), j <= query_start + i.
    """
    if query_start is None:
        query_start = key_length - query_length
    i = np.arange(query_length)[:, None]
    j = np.arange(key_length)[None, :]
    return j <= i + query_start


def combine_masks(*masks):
    """Logical AND of boolean masks (None entries ignored), broadcast together."""
    result = None
    for mask in masks:
        if mask is None:
            continue
        mask = np.asarray(mask).astype(bool)
        result = mask if result is None else np.logical_and(result, mask)
    return result


# ----------------------------------------------------------------------------- attention


def scaled_dot_product_attention(q, k, v, scale=None, bias=None, mask=None):
    """softmax(scale * Q K^T + bias + mask) V.

    q (B, H, T, Dh), k (B, H, S, Dh), v (B, H, S, Dh); bias broadcastable to (B, H, T, S);
    mask boolean broadcastable to (B, H, T, S), True = attend.
    Returns (outputs (B, H, T, Dh), probabilities (B, H, T, S)).
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    logits = scale * np.einsum("bhtd,bhsd->bhts", q, k)
    if bias is not None:
        logits = logits + _f64(bias)
    if mask is not None:
        logits = np.where(np.asarray(mask, dtype=bool), logits, logits + MASK_VALUE)
    probs = softmax(logits, axis=-1)
    return np.einsum("bhts,bhsd->bhtd", probs, v), probs


def _project(x, kernel, bias):
    # (B, L, D) x (D, N, Dh) -> (B, L, N, Dh)
    y = np.einsum("bld,dnk->blnk", _f64(x), _f64(kernel))
    return y if bias is None else y + _f64(bias)


def project_key_value(weights, value, key=None):
    """Projected keys and values, (B, S, Hkv, Dh) each (what an attention cache stores)."""
    key = value if key is None else key
    k = _project(key, weights["key_kernel"], weights.get("key_bias"))
    v = _project(value, weights["value_kernel"], weights.get("value_bias"))
    return k, v


def multi_head_attention(
    weights,
    query,
    value=None,
    key=None,
    scale=None,
    attention_mask=None,
    attention_bias=None,
    use_causal_mask=False,
    return_attention_scores=False,
    rotary_kwargs=None,
    sliding_window=None,
    query_key_norm=None,
    norm_epsilon=1e-6,
):
    """Multi-head (and grouped-query) attention with per-head projections and W_O.

    query (B, T, D), value (B, S, Dv) (defaults to query), key defaults to value.
    attention_mask: (B, S) key padding mask or (B, T, S), 1 = attend.
    attention_bias: additive, broadcastable to (B, H, T, S).
    use_causal_mask: bottom-right aligned causal mask (within `sliding_window` positions when given).
    rotary_kwargs: `rotary`'s keyword arguments: queries and keys turned at positions 0.. (self-attention).
    query_key_norm: "head" (Qwen3) or "full" (OLMoE): projected queries and keys RMS-normed (weights
    "query_norm_scale" / "key_norm_scale", epsilon `norm_epsilon`) over each head or all heads, before rotation.
    Grouped-query attention: H query heads share Hkv key/value heads, query head h reads
    key/value head h // (H // Hkv) (each key/value head is repeated for consecutive heads).
    """
    query = _f64(query)
    value = query if value is None else _f64(value)
    key = value if key is None else _f64(key)
    num_heads = weights["query_kernel"].shape[1]
    num_kv_heads = weights["key_kernel"].shape[1]
    T, S = query.shape[1], key.shape[1]

    q = _project(query, weights["query_kernel"], weights.get("query_bias"))  # (B, T, H, Dh)
    k, v = project_key_value(weights, value, key)  # (B, S, Hkv, Dh)
    if query_key_norm is not None:
        q = _normed_heads(q, weights["query_norm_scale"], query_key_norm, norm_epsilon)
        k = _normed_heads(k, weights["key_norm_scale"], query_key_norm, norm_epsilon)
    if rotary_kwargs is not None:
        q, k = rotary(q, np.arange(T), **rotary_kwargs), rotary(k, np.arange(S), **rotary_kwargs)
    group = num_heads // num_kv_heads
    k = np.repeat(k, group, axis=2)  # (B, S, Hkv, Dh) -> (B, S, H, Dh)
    v = np.repeat(v, group, axis=2)
    q, k, v = (np.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # (B, L, H, Dh) -> (B, H, L, Dh)

    mask = None
    if attention_mask is not None:
        attention_mask = np.asarray(attention_mask).astype(bool)
        if attention_mask.ndim == 2:
            attention_mask = padding_to_attention_mask(attention_mask, T)
        mask = attention_mask[:, None, :, :]  # (B, T, S) -> (B, 1, T, S)
    if use_causal_mask:
        causal = (
            causal_mask(T, S) if sliding_window is None else sliding_window_mask(np.arange(S - T, S), S, sliding_window)
        )
        mask = combine_masks(mask, causal[None, None])

    heads, probs = scaled_dot_product_attention(q, k, v, scale, attention_bias, mask)
    # (B, H, T, Dh) x (H, Dh, D) -> (B, T, D)
    out = np.einsum("bhtk,hkd->btd", heads, _f64(weights["output_kernel"]))
    if weights.get("output_bias") is not None:
        out = out + _f64(weights["output_bias"])
    return (out, probs) if return_attention_scores else out


def _normed_heads(x, scale, over, epsilon):
    """x (B, L, N, Dh) RMS-normed over each head's Dh values ("head") or over all N * Dh ("full")."""
    if over == "head":
        return rms_norm(x, scale, epsilon)
    B, L, N, Dh = x.shape
    return rms_norm(x.reshape(B, L, N * Dh), scale, epsilon).reshape(B, L, N, Dh)


# ----------------------------------------------------------------------------- positions


def rope_frequencies(rotary_dim, max_wavelength=10000.0, scaling=None):
    """RoPE's angle per position of each of the R/2 dim pairs, float64, with Hugging Face's scalings.

    theta_i = max_wavelength ** (-2 i / R). "linear": theta_i / factor. "llama3" (Llama 3.1): a
    wavelength 2 pi / theta_i longer than original / low_freq_factor is slowed by `factor`, one
    shorter than original / high_freq_factor is kept, and one between is interpolated with
    weight s = (original / wavelength - low) / (high - low) on the kept frequency.
    """
    theta = np.array([max_wavelength ** (-2.0 * i / rotary_dim) for i in range(rotary_dim // 2)])
    if scaling is None:
        return theta
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return theta / factor
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    out = []
    for t in theta:
        wavelength = 2 * math.pi / t
        if wavelength < original / high:
            out.append(t)
        elif wavelength > original / low:
            out.append(t / factor)
        else:
            s = (original / wavelength - low) / (high - low)
            out.append((1 - s) * t / factor + s * t)
    return np.array(out)


def rotary(x, positions, max_wavelength=10000.0, rotary_dim=None, scaling=None):
    """x (B, T, H, Dh) with pair (x[i], x[i + R/2]) of its first R dims turned by positions[t] * theta_i.

    A pair (a, b) turned by angle phi is (a cos phi - b sin phi, a sin phi + b cos phi); dims past R stay.
    """
    x = _f64(x)
    rotary_dim = rotary_dim or x.shape[-1]
    half = rotary_dim // 2
    phi = np.asarray(positions, np.float64)[:, None] * rope_frequencies(rotary_dim, max_wavelength, scaling)  # (T, R/2)
    cos, sin = np.cos(phi)[None, :, None, :], np.sin(phi)[None, :, None, :]  # (1, T, 1, R/2)
    a, b = x[..., :half], x[..., half:rotary_dim]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, x[..., rotary_dim:]], axis=-1)


def longrope_rotary(x, positions, max_wavelength, rotary_dim, scaling):
    """`rotary` with Phi-3's longrope: theta_i divided by short_factor[i], or by long_factor[i] when the sequence
    (the last position + 1) is longer than original_max_position_embeddings; the rotated dims (only) times the
    attention factor, as transformers' cos and sin are."""
    long = positions[-1] + 1 > scaling["original_max_position_embeddings"]
    factors = np.asarray(scaling["long_factor" if long else "short_factor"], np.float64)
    theta = rope_frequencies(rotary_dim, max_wavelength) / factors  # (R/2,)
    x = _f64(x)
    half = rotary_dim // 2
    phi = np.asarray(positions, np.float64)[:, None] * theta  # (T, R/2)
    cos, sin = np.cos(phi)[None, :, None, :], np.sin(phi)[None, :, None, :]  # (1, T, 1, R/2)
    a, b = x[..., :half], x[..., half:rotary_dim]
    turned = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1) * scaling["attention_factor"]
    return np.concatenate([turned, x[..., rotary_dim:]], axis=-1)


def sliding_window_mask(query_positions, key_length, window):
    """(T, S) boolean: query at position p attends key k iff p - window < k <= p."""
    p = np.asarray(query_positions)[:, None]
    k = np.arange(key_length)[None, :]
    return (k <= p) & (k > p - window)


def sinusoidal_table(length, dim):
    """(length, dim) table of the paper (interleaved sin/cos):
    PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D))."""
    table = np.zeros((length, dim), dtype=np.float64)
    for pos in range(length):
        for i in range(0, dim, 2):
            angle = pos / 10000 ** (i / dim)
            table[pos, i] = math.sin(angle)
            if i + 1 < dim:
                table[pos, i + 1] = math.cos(angle)
    return table


def learned_positions(embeddings, start_index, length):
    """Rows start_index .. start_index+length-1 of a learned (max_length, D) table."""
    return _f64(embeddings)[start_index : start_index + length]


def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket for one relative position n = key_pos - query_pos (Raffel et al. 2020).

    Bidirectional: half the buckets for n > 0, half for n <= 0, by |n|. Unidirectional:
    only n <= 0 distinguished (positive n all share bucket 0). Within a half, distances below
    max_exact = buckets/2 get one bucket each; larger ones are spaced logarithmically up to
    max_distance, and everything beyond shares the last bucket.
    """
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if relative_position > 0:
            bucket += num_buckets
        distance = abs(relative_position)
    else:
        distance = max(-relative_position, 0)
    max_exact = num_buckets // 2
    if distance < max_exact:
        return bucket + distance
    # log(distance / max_exact) / log(max_distance / max_exact) in [0, 1) spans the remaining
    # num_buckets - max_exact buckets; int() truncates like T5's cast to an integer.
    log_ratio = math.log(distance / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + int(log_ratio * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


def relative_position_bias(
    embeddings, query_length, key_length, bidirectional=True, num_buckets=32, max_distance=128, query_start=0
):
    """(1, H, T, S) bias from a (num_buckets, H) table, for query positions
    query_start..query_start+T-1 and key positions 0..S-1."""
    embeddings = _f64(embeddings)
    buckets = np.zeros((query_length, key_length), dtype=np.int64)
    for i in range(query_length):
        for j in range(key_length):
            buckets[i, j] = relative_position_bucket(j - (query_start + i), bidirectional, num_buckets, max_distance)
    bias = embeddings[buckets]  # (T, S, H)
    return np.transpose(bias, (2, 0, 1))[None]  # (T, S, H) -> (1, H, T, S)


# ----------------------------------------------------------------------------- norms


def layer_norm(x, gamma, beta, epsilon=1e-5):
    x = _f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * _f64(gamma) + _f64(beta)


def rms_norm(x, scale, epsilon=1e-5):
    x = _f64(x)
    return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + epsilon) * _f64(scale)


def norm(weights, x, norm_type, epsilon=1e-5):
    if norm_type == "layer_norm":
        return layer_norm(x, weights["gamma"], weights["beta"], epsilon)
    if norm_type == "rms_norm":
        return rms_norm(x, weights["scale"], epsilon)
    raise ValueError(f"unknown norm_type {norm_type!r}")


# ----------------------------------------------------------------------------- feed-forward


def relu(x):
    return np.maximum(x, 0.0)


def gelu(x):
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))."""
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_approximate(x):
    """tanh approximation (GPT-2's gelu_new)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {
    "relu": relu,
    "gelu": gelu,
    "gelu_approximate": gelu_approximate,
    "silu": silu,
    "gated-relu": relu,
    "gated-gelu": gelu_approximate,  # T5 v1.1 uses the tanh approximation
    "gated-gelu_exact": gelu,  # ModernBERT's GeGLU
    "gated-silu": silu,
}


def _dense(x, kernel, bias=None):
    y = _f64(x) @ _f64(kernel)
    return y if bias is None else y + _f64(bias)


def feed_forward(weights, x, activation="relu"):
    """Non-gated: act(x W1 + b1) W2 + b2. Gated: (act(x Wg + bg) * (x W1 + b1)) W2 + b2."""
    act = ACTIVATIONS[activation]
    hidden = _dense(x, weights["intermediate_kernel"], weights.get("intermediate_bias"))
    if activation.startswith("gated-"):
        hidden = act(_dense(x, weights["gate_kernel"], weights.get("gate_bias"))) * hidden
    else:
        hidden = act(hidden)
    return _dense(hidden, weights["output_kernel"], weights.get("output_bias"))


def mixture_of_experts(weights, x, top_k, normalize_top_k=True, activation="silu"):
    """Sparse MoE, token by token: softmax(x W_router) over E experts; the top k kept (renormalised to sum to one
    when `normalize_top_k`); sum_k w_k (act(x Wg_e) * (x Wu_e)) Wd_e; plus a shared gated expert
    (`shared_*` weights), scaled by sigmoid(x w_shared_gate) when that weight is given."""
    act = ACTIVATIONS[activation]
    flat = _f64(x).reshape(-1, x.shape[-1])  # (N, D)
    probabilities = softmax(flat @ _f64(weights["router_kernel"]))  # (N, E)
    out = np.zeros_like(flat)
    for n, row in enumerate(flat):
        chosen = np.argsort(-probabilities[n], kind="stable")[:top_k]
        kept = probabilities[n, chosen]
        if normalize_top_k:
            kept = kept / kept.sum()
        for expert, weight in zip(chosen, kept):
            hidden = act(row @ _f64(weights["gate_kernel"][expert])) * (row @ _f64(weights["up_kernel"][expert]))
            out[n] += weight * (hidden @ _f64(weights["down_kernel"][expert]))
    if "shared_gate_kernel" in weights or "shared_up_kernel" in weights:
        shared = act(flat @ _f64(weights["shared_gate_kernel"])) * (flat @ _f64(weights["shared_up_kernel"]))
        shared = shared @ _f64(weights["shared_down_kernel"])
        if "shared_expert_gate_kernel" in weights:
            shared = shared / (1.0 + np.exp(-(flat @ _f64(weights["shared_expert_gate_kernel"]))))
        out += shared
    return out.reshape(x.shape)


# ----------------------------------------------------------------------------- blocks


def _sublayer(x, fn, norm_weights, norm_type, norm_first, epsilon):
    """One residual sublayer. Post-norm: N(x + f(x)). Pre-norm: x + f(N(x))."""
    if norm_first:
        return x + fn(norm(norm_weights, x, norm_type, epsilon))
    return norm(norm_weights, x + fn(x), norm_type, epsilon)


def encoder_block(
    weights,
    x,
    activation="relu",
    norm_type="layer_norm",
    norm_first=False,
    epsilon=1e-5,
    attention_scale=None,
    padding_mask=None,
    attention_mask=None,
    attention_bias=None,
):
    """Self-attention sublayer then feed-forward sublayer (dropout 0).

    padding_mask (B, T) and attention_mask (B, T, T) are combined with AND.
    """
    x = _f64(x)
    T = x.shape[1]
    mask = combine_masks(None if padding_mask is None else padding_to_attention_mask(padding_mask, T), attention_mask)

    def attend(h):
        return multi_head_attention(
            weights["self_attention"], h, scale=attention_scale, attention_mask=mask, attention_bias=attention_bias
        )

    x = _sublayer(x, attend, weights["self_attention_norm"], norm_type, norm_first, epsilon)
    ffn = functools.partial(feed_forward, weights["feed_forward"], activation=activation)
    return _sublayer(x, ffn, weights["feed_forward_norm"], norm_type, norm_first, epsilon)


def decoder_block(
    weights,
    x,
    encoder_outputs=None,
    activation="relu",
    norm_type="layer_norm",
    norm_first=False,
    epsilon=1e-5,
    attention_scale=None,
    padding_mask=None,
    encoder_padding_mask=None,
    self_attention_bias=None,
    cross_attention_bias=None,
    use_causal_mask=True,
):
    """Causal self-attention, optional cross-attention over encoder_outputs, feed-forward.

    padding_mask (B, T) masks the decoder's own keys; encoder_padding_mask (B, S_enc) masks
    the encoder outputs in cross-attention.
    """
    x = _f64(x)
    T = x.shape[1]
    self_mask = None if padding_mask is None else padding_to_attention_mask(padding_mask, T)

    def self_attend(h):
        return multi_head_attention(
            weights["self_attention"],
            h,
            scale=attention_scale,
            attention_mask=self_mask,
            attention_bias=self_attention_bias,
            use_causal_mask=use_causal_mask,
        )

    x = _sublayer(x, self_attend, weights["self_attention_norm"], norm_type, norm_first, epsilon)

    if "cross_attention" in weights:
        cross_mask = None if encoder_padding_mask is None else padding_to_attention_mask(encoder_padding_mask, T)

        def cross_attend(h):
            return multi_head_attention(
                weights["cross_attention"],
                h,
                value=encoder_outputs,
                scale=attention_scale,
                attention_mask=cross_mask,
                attention_bias=cross_attention_bias,
            )

        x = _sublayer(x, cross_attend, weights["cross_attention_norm"], norm_type, norm_first, epsilon)

    ffn = functools.partial(feed_forward, weights["feed_forward"], activation=activation)
    return _sublayer(x, ffn, weights["feed_forward_norm"], norm_type, norm_first, epsilon)
