"""The decoding loop of a bundle: greedy, random and beam search over a token buffer, numpy only.

It is the loop of `keras_transformer.samplers`, step for step, so the same model gives the same
tokens: greedy and beam search exactly, and random sampling too for the same seed (the noise is
the same hash of (seed, step, row), see `sampling.uniform_noise`). Prompts of different lengths
share a batch: a row is fed its own prompt token until its prompt ends and its chosen token
afterwards. A row stops at its end token (kept) or after `max_new_tokens`.

Axes: B inputs, K beams, R = B * K rows, L token buffer length, V vocabulary.
"""

import numpy as np

from sampling import NEG, log_softmax, uniform_noise


class Interrupted(Exception):
    """`Generator.generate_ids` stopped before a step because its `interrupt` callable returned True."""


class DecodeLoop:
    """The decoding loop over a token buffer (R, L): at position i, choose token i, then feed it.

    A row reads its prompt up to its length; rows may finish at different steps but stay in
    the batch until all are done. `generator._step(tokens, state)` runs the model one position.
    """

    def __init__(self, generator, tokens, lengths, max_new_tokens, pad, stop, interrupt=None):
        self.generator = generator
        self.interrupt = interrupt  # None, or asked before every step (see `Generator.generate_ids`)
        self.tokens = tokens  # (R, L)
        self.lengths = lengths  # (R,)
        self.max_new_tokens = max_new_tokens
        self.pad = pad
        self.stop = stop  # tuple of stop token ids

    def sample(self, i, logits, state, pick, seed):
        """Greedy or random (seed: the noise's int32 seed, None for greedy): one token per row per step.
        Returns each row's new tokens."""
        tokens, lengths = self.tokens, self.lengths
        done = np.zeros(tokens.shape[0], bool)
        limits = lengths + self.max_new_tokens
        while True:
            picked = pick(logits, None if seed is None else uniform_noise(seed, i, tokens.shape[0]))
            in_prompt = i < lengths
            emitted = ~in_prompt & ~done
            token = np.where(in_prompt, tokens[:, i], np.where(done, self.pad, picked))
            tokens[:, i] = token
            done = done | (emitted & np.isin(token, self.stop)) | (i + 1 >= limits)
            if i + 1 >= tokens.shape[1] or done.all():
                break
            logits, state = self._step(tokens, i, state)
            i += 1
        return [_cut(tokens[r, lengths[r] : lengths[r] + self.max_new_tokens], self.stop) for r in range(len(tokens))]

    def beam_search(self, i, logits, state, beams, length_penalty, early_stopping):
        """Beam search exactly as `keras_transformer.samplers.BeamSampler` (finished store, length penalty).

        Each step takes the C best (beam, token) continuations of every input: those that end (a stop
        token, or the length limit) are offered to the store of finished hypotheses, and the K best of
        the others are the next beams. Returns each input's best finished hypothesis, new tokens only.
        """
        tokens, K = self.tokens, beams
        R, L = tokens.shape
        B, V = R // K, logits.shape[-1]
        lengths = self.lengths.reshape(B, K)[:, 0]
        # Only the first beam of each input is live at first: the others would repeat its continuations.
        beam_scores = np.concatenate([np.zeros((B, 1), np.float32), np.full((B, K - 1), NEG, np.float32)], axis=1)
        done = np.zeros(B, bool)
        finished = _FinishedBeams(B, K, L, self.pad)
        num_candidates = min(max(2, 1 + len(self.stop)) * K, K * V)
        rank = np.arange(num_candidates)[None, :]
        while True:
            generated = i + 1 - lengths  # (B,)
            in_prompt = i < lengths
            active = ~in_prompt & ~done
            at_limit = generated >= self.max_new_tokens
            top_scores, top_beam, top_token = _candidates(logits, beam_scores, num_candidates)  # (B, C) each
            finishes = np.isin(top_token, self.stop) | at_limit[:, None]

            # Of the K best candidates, those that end enter the store, scored by their length.
            accepting = active & ~finished.valid.all(axis=1) if early_stopping is True else active
            new_valid = finishes & (rank < K) & accepting[:, None] & (top_scores > NEG / 2)
            length = np.maximum(generated, 1).astype(np.float32)[:, None]
            new_scores = np.where(new_valid, top_scores / length ** np.float32(length_penalty), 2 * NEG)
            candidate_tokens = np.take_along_axis(tokens.reshape(B, K, L), top_beam[:, :, None], axis=1).copy()
            candidate_tokens[:, :, i] = top_token  # (B, C, L)
            finished.add(candidate_tokens, new_scores, new_valid, end=i + 1)

            # The others compete for the K beams.
            new_beam_scores, next_beam, next_token = _running_beams(top_scores, top_beam, top_token, finishes, K)
            now_done = self._search_over(
                finished, new_beam_scores[:, 0], generated, at_limit, length_penalty, early_stopping
            )
            done = np.where(active, now_done, done)
            tokens, order = _follow_beams(tokens, i, next_beam, next_token, active, in_prompt, self.pad)
            beam_scores = np.where(active[:, None], new_beam_scores, beam_scores)
            if i + 1 >= L or done.all():
                break
            if not np.array_equal(order, np.arange(R)):
                state = reorder_state(state, order)
            logits, state = self._step(tokens, i, state)
            i += 1
        return [finished.tokens[b, 0, lengths[b] : finished.ends[b, 0]] for b in range(B)]

    def _search_over(self, finished, best_running, generated, at_limit, length_penalty, early_stopping):
        """(B,) whether each input's search is over: it reached its length limit, or its best running
        beam (score `best_running`, (B,)) cannot beat the worst of K finished hypotheses; with
        `early_stopping=True`, also as soon as it has K finished hypotheses."""
        if early_stopping == "never" and length_penalty > 0:
            best_length = np.float32(self.max_new_tokens)  # the beam may grow to the limit, its score with it
        else:
            best_length = np.maximum(generated, 1).astype(np.float32)
        best_possible = best_running / best_length ** np.float32(length_penalty)
        all_valid = finished.valid.all(axis=1)
        worst = np.where(all_valid, finished.scores.min(axis=1), NEG)
        now_done = at_limit | (best_possible <= worst)
        if early_stopping is True:
            now_done = now_done | all_valid
        return now_done

    def _step(self, tokens, i, state):
        """Feed position i of every row's tokens (R, L). A model whose cache goes stale at N (the bundle's
        `cache.refresh_after`: longrope) feeds position N as transformers' generate does: every position
        [0, N] again, into a new cache (`Generator.refresh`)."""
        if self.interrupt is not None and self.interrupt():
            raise Interrupted("generation interrupted by its caller")
        if i == self.generator.refresh_after:
            return self.generator.refresh(tokens[:, : i + 1], tokens.shape[1])
        return self.generator._step(tokens[:, i], state)


class _FinishedBeams:
    """Beam search's finished hypotheses: the K best of each input so far, best first.

    tokens (B, K, L) whole rows, scores (B, K) length-penalised (2 * NEG: none yet), valid (B, K),
    ends (B, K) one past each hypothesis's last token.
    """

    def __init__(self, B, K, L, pad):
        self.tokens = np.full((B, K, L), pad, np.int64)
        self.scores = np.full((B, K), 2 * NEG, np.float32)
        self.valid = np.zeros((B, K), bool)
        self.ends = np.zeros((B, K), np.int64)

    def add(self, tokens, scores, valid, end):
        """Keep the K best of the store and C candidates ending at `end`: tokens (B, C, L),
        scores (B, C) (2 * NEG where not valid), valid (B, C)."""
        K = self.scores.shape[1]
        merged_scores = np.concatenate([self.scores, scores.astype(np.float32)], axis=1)  # (B, K + C)
        self.scores, keep = _top_k(merged_scores, K)  # (B, K) each
        self.valid = np.take_along_axis(np.concatenate([self.valid, valid], axis=1), keep, axis=1)
        self.tokens = np.take_along_axis(np.concatenate([self.tokens, tokens], axis=1), keep[:, :, None], axis=1)
        ends = np.concatenate([self.ends, np.full(valid.shape, end)], axis=1)  # (B, K + C)
        self.ends = np.take_along_axis(ends, keep, axis=1)


def _candidates(logits, beam_scores, num_candidates):
    """The C best continuations of each input's K beams, best first: scores, beams and tokens, each (B, C).

    logits (R, V); beam_scores (B, K), the beams' summed log-probabilities."""
    B, K = beam_scores.shape
    V = logits.shape[-1]
    total = log_softmax(logits).reshape(B, K, V)  # (R, V) -> (B, K, V)
    total += beam_scores[:, :, None]
    top_scores, top_index = _top_k(total.reshape(B, K * V), num_candidates)  # (B, K * V) -> (B, C)
    return top_scores, top_index // V, top_index % V


def _running_beams(top_scores, top_beam, top_token, finishes, K):
    """The K best candidates that do not end: scores, beams and tokens, each (B, K)."""
    running = np.where(finishes, top_scores + NEG, top_scores)  # an ending candidate sinks below the others
    scores, pick = _top_k(running, K)
    return scores, np.take_along_axis(top_beam, pick, axis=1), np.take_along_axis(top_token, pick, axis=1)


def _follow_beams(tokens, i, next_beam, next_token, active, in_prompt, pad):
    """Rows take their new beams' histories, then token i -> (tokens (R, L), order (R,)), where row r
    continues old row order[r]; an input not searching (in its prompt, or done) keeps its rows."""
    B, K = next_beam.shape
    keep_beam = np.broadcast_to(np.arange(K)[None, :], (B, K))
    next_beam = np.where(active[:, None], next_beam, keep_beam)
    order = (np.arange(B)[:, None] * K + next_beam).reshape(-1)  # (B, K) -> (R,)
    tokens = tokens[order]
    token = np.where(in_prompt[:, None], tokens[:, i].reshape(B, K), np.where(active[:, None], next_token, pad))
    tokens[:, i] = token.reshape(-1)
    return tokens, order


def stop_tokens(stop_token_ids, config, vocabulary_size):
    """`stop_token_ids` as `lm.generate` takes it ("auto", None, an id or ids) -> a tuple of ids; "auto" reads the
    bundle's generation config (`config`): its `stop_token_ids` (the model's end tokens), else its end token."""
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(f"`stop_token_ids` must be 'auto', None or a list of ids. Received: {stop_token_ids!r}")
        return auto_stop_tokens(config)
    if stop_token_ids is None:
        return ()
    ids = [stop_token_ids] if isinstance(stop_token_ids, (int, np.integer)) else list(stop_token_ids)
    if not all(isinstance(t, (int, np.integer)) and 0 <= t < vocabulary_size for t in ids):
        raise ValueError(f"`stop_token_ids` must hold ids in [0, {vocabulary_size}). Received: {stop_token_ids!r}")
    return tuple(int(t) for t in ids)


def auto_stop_tokens(config):
    """The ids "auto" stops at: the generation config's `stop_token_ids`, else its `eos_token_id`, else none."""
    if config.get("stop_token_ids") is not None:
        return tuple(int(t) for t in config["stop_token_ids"])
    eos = config.get("eos_token_id")
    return () if eos is None else (int(eos),)


def _cut(row, stop):
    """New tokens up to and including the first stop token."""
    row = list(row)
    for index, token in enumerate(row):
        if token in stop:
            return row[: index + 1]
    return row


def _top_k(values, k):
    """The k largest of each row, best first; ties keep the lower index first (as `ops.top_k`).

    A bound on each row's k-th largest value picks the candidates; only those are sorted, by
    value and index. On wide rows (beam search: K * V scores) the bound is the k-th largest of
    4k chunk maxima: k distinct entries are at least that large, so every top-k entry is a
    candidate, and it costs a max over the row instead of a partition (benchmarks/RESULTS.md,
    "Bundle runtime: numbers cited by its comments", `_top_k`).
    """
    rows, width = values.shape
    if k >= width:
        index = np.argsort(-values, axis=-1, kind="stable")[:, :k]
        return np.take_along_axis(values, index, axis=-1), index
    chunks = 4 * k
    size = width // chunks
    if size >= 64:
        maxima = values[:, : size * chunks].reshape(rows, chunks, size).max(axis=-1)  # (rows, 4k)
        if size * chunks < width:  # the tail is one more chunk
            maxima = np.concatenate([maxima, values[:, size * chunks :].max(axis=-1, keepdims=True)], axis=-1)
        kth = -np.partition(-maxima, k - 1, axis=-1)[:, k - 1 : k]  # (rows, 1) <= the k-th largest value
    else:
        kth = -np.partition(-values, k - 1, axis=-1)[:, k - 1 : k]  # (rows, 1) the k-th largest value
    index = np.empty((values.shape[0], k), np.int64)
    for row in range(values.shape[0]):
        candidates = np.flatnonzero(values[row] >= kth[row])
        order = np.lexsort((candidates, -values[row, candidates]))[:k]  # by value, then index
        index[row] = candidates[order]
    return np.take_along_axis(values, index, axis=-1), index


def tile_state(state, beams):
    """Every row becomes K rows: (B, ...) -> (B * K, ...)."""
    tiled = {**state, "past": [np.repeat(array, beams, axis=0) for array in state["past"]]}
    if "cross" in state:
        tiled["cross"] = [np.repeat(array, beams, axis=0) for array in state["cross"]]
        tiled["encoder_mask"] = np.repeat(state["encoder_mask"], beams, axis=0)
    return tiled


def reorder_state(state, rows):
    """The decode state after beam search picked its new beams: row r continues old row `rows[r]`."""
    # Only the self-attention caches differ between the beams of an input; cross-attention ones do not.
    if "binding" not in state:
        return {**state, "past": [array[rows] for array in state["past"]]}
    # In-place buffers (R, Hkv, L, Dh): rather than moving every history to its beam's row, a
    # beam keeps the buffer row of its parent, and only a parent's second, third... child gets a
    # copy, into a row no beam continues (so no source is overwritten), of the positions written.
    # An input has as many such copies as free rows among its own K, and both lists are sorted:
    # a slot stays among its input's rows (those a seq2seq decoder binds that input's encoder to).
    slots = np.arange(rows.size) if state["slots"] is None else state["slots"]
    parents = slots[rows]  # (R,) the buffer row each new beam continues
    _, first = np.unique(parents, return_index=True)
    copies = np.setdiff1d(np.arange(rows.size), first)  # beams whose parent row is taken
    free = np.setdiff1d(np.arange(rows.size), parents)  # rows no beam continues, as many
    filled = state["position"]
    for beam, row in zip(copies, free):
        for buffer in state["past"]:
            buffer[row, :, :filled] = buffer[parents[beam], :, :filled]
    slots = parents.copy()
    slots[copies] = free
    return {**state, "slots": None if np.array_equal(slots, np.arange(rows.size)) else slots}
