"""Logits processors, in Hugging Face's order: repetition penalty, n-gram ban, minimum length.

Axes: R decoded rows, L token buffer length, V vocabulary.
"""

from keras import ops

from keras_transformer.samplers.rows import column

# Score of impossible tokens and beams: finite, so that sums never make inf - inf = NaN.
NEG = -1.0e9


def process(scores, rows, i, ctx):
    """Scores (R, V) of position i after the processors `ctx.options` asks for (rows: the loop's `Rows`)."""
    options = ctx.options
    if options.repetition:
        penalty = ctx.repetition_penalty
        penalized = ops.where(scores < 0, scores * penalty, scores / penalty)
        scores = ops.where(rows.seen, penalized, scores)
    if options.no_repeat_ngram_size:
        banned = banned_ngram_tokens(
            rows.tokens, i, options.no_repeat_ngram_size, ctx.vocabulary_size, options.gather_columns
        )
        scores = ops.where(banned, NEG, scores)
    if ctx.stop_token_ids:
        too_early = (i - ctx.prompt_lengths) < ctx.min_new_tokens  # (R,) fewer than min_new_tokens so far
        stop = is_stop_token(ops.arange(ctx.vocabulary_size, dtype="int32"), ctx.stop_token_ids)  # (V,)
        scores = ops.where(ops.logical_and(too_early[:, None], stop[None, :]), NEG, scores)
    return scores


def is_stop_token(tokens, stop_token_ids):
    """Boolean mask of the same shape as `tokens`: which ones are stop tokens (a static tuple)."""
    hit = ops.zeros(ops.shape(tokens), "bool")
    for token_id in stop_token_ids:
        hit = ops.logical_or(hit, tokens == token_id)
    return hit


def banned_ngram_tokens(tokens, i, n, vocabulary_size, gather=False):
    """(R, V) mask of the tokens that would repeat an n-gram already in tokens[:, :i].

    Token v is banned at position i when some earlier n-gram tokens[j : j + n] (ending before
    i) starts with the last n - 1 tokens tokens[i - n + 1 : i] and ends with v. `gather`: see `rows.column`.
    """
    num_rows, length = tokens.shape
    starts = ops.arange(length, dtype="int32")  # j
    match = ops.logical_and(starts + n - 1 < i, i - n + 1 >= 0)[None, :]  # (1, L)
    padded = ops.pad(tokens, ((0, 0), (0, n)))  # (R, L + n): tokens[:, j + k] exists for every j
    for k in range(n - 1):
        earlier = padded[:, k : k + length]  # (R, L): tokens[:, j + k]
        current = column(padded, ops.maximum(i - n + 1 + k, 0), gather)[:, None]  # (R, 1)
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
