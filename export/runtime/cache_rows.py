"""The rows of a continuous batch: the decode graph's in-place caches for up to M sequences.

Axes: N active rows, M the most rows, L the model's max_length, Hkv key/value heads, Dh head size,
V vocabulary, S_src a seq2seq source's length.

`BatchDecoder` holds the decode graph's caches for M rows, 2 x layers buffers (M, Hkv, L, Dh),
with the N active rows in rows [0, N). New sequences are prefilled (those of one prompt length
together, their keys and values copied into rows [N, N + k)), or, when their prompt starts with a stored
prefix (`prefix_cache.PrefixCache`), prefilled after it by the decode graph's multi-token step; a step
feeds every active row its last token at its own position (`position_ids` (N, 1): GroupQueryAttention reads
each row's own past length) and writes the new position in place; a finished row is replaced by the last active
row (its written positions copied), so the rows stay packed and a step computes nothing for free
rows. A seq2seq LM's rows also hold their source's cross-attention keys/values (M, Hkv, S_src, Dh) and
mask (M, S_src) (each source encoded on arrival, zero past its length); they start empty and are
fed the decoder start token at position 0. Which sequence holds which row is `batching.Scheduler`'s
business.
"""

import mmap

import numpy as np
import onnxruntime


class BatchDecoder:
    """The decode graph's in-place caches for up to `max_rows` sequences at different positions.

    Args:
        generator: a `generate.Generator` over an LM bundle whose decode graph takes `position_ids`
            (writes its caches in place): a causal LM, or a seq2seq LM (whose rows also hold their
            source's cross-attention keys/values and mask).
        max_rows: int, the most sequences decoded together (M).
    """

    def __init__(self, generator, max_rows):
        if not self.supports(generator):
            raise ValueError(
                f"Continuous batching needs a bundle whose decode graph takes position_ids. "
                f"Received: bundle_dir={generator.bundle_dir!r}"
            )
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"`max_rows` must be a positive int. Received: max_rows={max_rows!r}")
        self.generator, self.max_rows = generator, max_rows
        self.length = int(generator.config["max_length"])  # L
        heads, head_dim = generator._cache_shape
        self.caches = [
            _zeros((max_rows, heads, self.length, head_dim))  # 2 x layers x (M, Hkv, L, Dh)
            for _ in generator._past_names
        ]
        self.cross, self.encoder_mask = [], None
        if generator.kind == "encoder_decoder":  # sources of up to S_src = L tokens, as `Generator` reads them
            self.cross = [
                _zeros((max_rows, heads, self.length, head_dim))  # (M, Hkv, S_src, Dh)
                for _ in generator._cross_names
            ]
            self.encoder_mask = np.zeros((max_rows, self.length), np.int64)  # (M, S_src): 0 past a row's source
        self.input_ids = np.zeros((max_rows, 1), np.int64)
        self.position_ids = np.zeros((max_rows, 1), np.int64)  # each row's next position = its written length
        self.logits = np.zeros((max_rows, 1, generator.bundle["vocabulary_size"]), np.float32)
        self.size = 0  # N
        self._binding, self._bound_size = None, -1

    @staticmethod
    def supports(generator):
        # A model whose cache goes stale at N (longrope, `Generator.refresh_after`) computes its cache again when a
        # sequence passes N: whole-batch loops (`decode_loop.DecodeLoop`) do, rows of different positions do not.
        return generator._in_place and generator.refresh_after is None

    def add(self, prompts):
        """k prompts of one length T into rows [N, N + k) -> (row N, the logits of their next position (k, V)).

        A causal LM's prompts are prefilled (next position T); a seq2seq LM's sources are encoded and
        its rows start empty (next position 0, fed the decoder start token): logits None.
        """
        logits, state = self.prefill(prompts)
        return self.insert(state), logits

    def prefill(self, prompts):
        """k prompts of one length -> (logits or None, their state for `insert`). Touches no row: another
        thread may prefill while the batch steps."""
        tokens = np.asarray(prompts, np.int64)  # (k, T)
        limit = self.length if self.encoder_mask is not None else self.length - 1
        if tokens.ndim != 2 or not 0 < tokens.shape[1] <= limit:
            raise ValueError(
                f"`prompts` must be prompts of one length, 1 to {limit} tokens. "
                f"Received: an array of shape {tokens.shape}"
            )
        if self.encoder_mask is None:
            logits, state = self.generator._prefill(tokens)  # past: (k, T, Hkv, Dh)
        else:
            logits, state = None, self.generator._encode(list(tokens))  # cross: (k, Hkv, T, Dh)
        return logits, {**state, "count": tokens.shape[0], "length": tokens.shape[1]}

    def prefill_after(self, past, tokens):
        """One prompt whose first P positions' keys/values are known: `past` 2L x (Hkv, P, Dh) (each layer's keys,
        then values; a `prefix_cache.PrefixCache` hit), `tokens` its T >= 1 other ids -> (the logits of its next
        position (1, V), its state for `insert`), run by the decode graph's multi-token step on buffers of its
        own (P + T positions). Touches no row."""
        P, T = past[0].shape[1], len(tokens)
        if not 0 < P + T <= self.length - 1 or T < 1:
            raise ValueError(
                f"A prompt must hold 1 to {self.length - 1} tokens, one after its past. Received: P={P}, T={T}"
            )
        heads, head_dim = self.generator._cache_shape
        buffers = []
        for keys in past:
            buffer = np.empty((1, heads, P + T, head_dim), np.float32)  # (1, Hkv, P + T, Dh)
            buffer[0, :, :P] = keys
            buffers.append(buffer)
        positions = np.arange(P, P + T)[None]  # (1, T)
        logits = self.generator.step_in_place(buffers, np.asarray(tokens, np.int64)[None], positions)  # (1, T, V)
        return logits[:, -1], {"past": buffers, "heads_first": True, "count": 1, "length": P + T}

    @staticmethod
    def keys_values(state, row):
        """Row `row` of a `prefill` / `prefill_after` state: 2L arrays (Hkv, S, Dh), its keys/values (views)."""
        if state.get("heads_first"):
            return [past[row] for past in state["past"]]
        return [past[row].transpose(1, 0, 2) for past in state["past"]]  # (T, Hkv, Dh) -> (Hkv, T, Dh)

    def insert(self, state):
        """A `prefill` state into rows [N, N + k) -> N."""
        count, length = state["count"], state["length"]
        if self.size + count > self.max_rows:
            raise RuntimeError(f"{count} more rows would pass max_rows={self.max_rows} ({self.size} taken).")
        rows = slice(self.size, self.size + count)
        if self.encoder_mask is None:
            for cache, past in zip(self.caches, state["past"]):
                # prefill_after's heads first already; prefill's (k, T, Hkv, Dh) -> (k, Hkv, T, Dh)
                cache[rows, :, :length] = (
                    past[:, :, :length] if state.get("heads_first") else past.transpose(0, 2, 1, 3)
                )
            self.position_ids[rows] = length
        else:
            for cache, keys in zip(self.cross, state["cross"]):
                cache[rows, :, :length] = keys  # (k, Hkv, T, Dh), heads first
                cache[rows, :, length:] = 0
            self.encoder_mask[rows] = 0
            self.encoder_mask[rows, :length] = 1
            self.position_ids[rows] = 0
        first, self.size = self.size, self.size + count
        return first

    def step(self, tokens):
        """Feed each active row its token (N,) at its position -> the next logits (N, V) (a view, valid until
        the next step)."""
        n = self.size
        if n == 0:
            raise RuntimeError("No active row to step.")
        if int(self.position_ids[:n].max()) >= self.length:
            raise ValueError(f"A row would pass the model's max_length={self.length}.")
        self.input_ids[:n, 0] = tokens
        self.generator.sessions[self.generator._step_graph].run_with_iobinding(self._bind(n))
        self.position_ids[:n] += 1
        return self.logits[:n, -1]

    def remove(self, row):
        """Free `row`: the last active row moves into it (its written positions copied). Returns the moved
        row's old index."""
        last = self.size - 1
        if not 0 <= row <= last:
            raise ValueError(f"`row` must be an active row in [0, {self.size}). Received: row={row}")
        if row != last:
            written = int(self.position_ids[last, 0])
            for cache in self.caches:
                cache[row, :, :written] = cache[last, :, :written]
            for cache in self.cross:
                cache[row] = cache[last]
            if self.encoder_mask is not None:
                self.encoder_mask[row] = self.encoder_mask[last]
            self.position_ids[row] = self.position_ids[last]
        self.size = last
        return last

    def _bind(self, n):
        """IO binding over the first n rows of every buffer (views share the buffers' memory); rebuilt when n
        changes."""
        if n != self._bound_size:
            generator = self.generator
            binding = generator.sessions[generator._step_graph].io_binding()
            values = []
            for cache, past_name, present_name in zip(self.caches, generator._past_names, generator._present_names):
                value = onnxruntime.OrtValue.ortvalue_from_numpy(cache[:n])  # contiguous rows: no copy
                binding.bind_ortvalue_input(past_name, value)
                binding.bind_ortvalue_output(present_name, value)
                values.append(value)
            inputs = [("input_ids", self.input_ids), ("position_ids", self.position_ids)]
            if self.encoder_mask is not None:
                inputs += [("encoder_attention_mask", self.encoder_mask), *zip(generator._cross_names, self.cross)]
            for name, array in inputs:
                values.append(onnxruntime.OrtValue.ortvalue_from_numpy(array[:n]))
                binding.bind_ortvalue_input(name, values[-1])
            values.append(onnxruntime.OrtValue.ortvalue_from_numpy(self.logits[:n]))
            binding.bind_ortvalue_output("logits", values[-1])
            self._binding, self._values, self._bound_size = binding, values, n  # OrtValues live with the binding
        return self._binding


def _zeros(shape):
    """np.zeros(shape, float32) whose memory is taken 4 KB page by page as rows are written. A row's buffer per
    head (L x Dh floats: 2 MB at 8192 x 64) is a huge page's size: with transparent huge pages, writing a row's
    first positions would take all of it (the M rows of a SmolLM2-135M bundle: 12 GB at once)."""
    memory = mmap.mmap(-1, max(4, int(np.prod(shape)) * 4))  # anonymous, zero-filled
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, np.float32, int(np.prod(shape))).reshape(shape)
