"""Continuous batching over a causal LM bundle: numpy, onnxruntime and tokenizers only.

Every ONNX bundle carries a copy of this file next to `generate.py`, whose graphs and samplers
it reuses. `serve.py` drives it; from Python:

    from generate import Generator
    from batching import Scheduler, Sequence
    scheduler = Scheduler(Generator("BUNDLE"), max_rows=32).start()
    scheduler.submit(Sequence(prompt_ids, max_tokens=16, on_event=print))

Axes: N active rows, M the most rows, L the model's max_length, Hkv key/value heads,
Dh head size, V vocabulary.

`BatchDecoder` holds the decode graph's caches for M rows, 2 x layers buffers (M, Hkv, L, Dh),
with the N active rows in rows [0, N). A new sequence is prefilled alone (its prompt's keys
and values copied into row N); a step feeds every active row its last token at its own
position (`position_ids` (N, 1): GroupQueryAttention reads each row's own past length) and
writes the new position in place; a finished row is replaced by the last active row (its
written positions copied), so the rows stay packed and a step computes nothing for free rows.

`Scheduler` is one thread: at each step boundary it admits waiting sequences (up to M rows),
runs one step for all, hands each row its token (`on_event`), and removes rows that stopped,
were cancelled (a client that went away) or ran past their deadline. Sampling is per row:
greedy, or `generate.py`'s random sampler with the row's own temperature/top-k/top-p and noise
(seed, position, choice), so a seeded answer does not depend on its neighbours. Each row's
arithmetic is its own (per-row attention, row-wise matrix products), so a greedy answer is
the same alone or in a batch (tested). Other bundles (seq2seq, traced decode graphs, beam
search) run whole requests one at a time through `Generator.generate_ids`.
"""

import collections
import threading
import time

import numpy as np
import onnxruntime

import generate as runtime


class QueueFull(Exception):
    """More sequences wait than the scheduler's `max_queue`."""


class BatchDecoder:
    """The decode graph's in-place caches for up to `max_rows` sequences at different positions.

    Args:
        generator: a `generate.Generator` over a causal LM bundle whose decode graph takes
            `position_ids` (writes its caches in place).
        max_rows: int, the most sequences decoded together (M).
    """

    def __init__(self, generator, max_rows):
        if not self.supports(generator):
            raise ValueError(f"Continuous batching needs a causal LM bundle whose decode graph takes position_ids. "
                             f"Received: bundle_dir={generator.bundle_dir!r}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"`max_rows` must be a positive int. Received: max_rows={max_rows!r}")
        self.generator, self.max_rows = generator, max_rows
        self.length = int(generator.config["max_length"])  # L
        heads, head_dim = generator._cache_shape
        self.caches = [np.zeros((max_rows, heads, self.length, head_dim), np.float32)  # 2 x layers x (M, Hkv, L, Dh)
                       for _ in generator._past_names]
        self.input_ids = np.zeros((max_rows, 1), np.int64)
        self.position_ids = np.zeros((max_rows, 1), np.int64)  # each row's next position = its written length
        self.logits = np.zeros((max_rows, 1, generator.bundle["vocabulary_size"]), np.float32)
        self.size = 0  # N
        self._binding, self._bound_size = None, -1

    @staticmethod
    def supports(generator):
        return generator.kind == "decoder" and generator._in_place

    def add(self, prompt_ids):
        """Prefill a prompt (T,) into row N -> (its row, the logits of position T (V,))."""
        if self.size == self.max_rows:
            raise RuntimeError(f"All max_rows={self.max_rows} rows are taken.")
        tokens = np.asarray(prompt_ids, np.int64).reshape(1, -1)  # (1, T)
        if not 0 < tokens.shape[1] < self.length:
            raise ValueError(f"A prompt must hold 1 to {self.length - 1} tokens. Received: {tokens.shape[1]} tokens")
        logits, state = self.generator._prefill(tokens)
        row, length = self.size, tokens.shape[1]
        for cache, past in zip(self.caches, state["past"]):
            cache[row, :, :length] = past[0].transpose(1, 0, 2)  # (T, Hkv, Dh) -> (Hkv, T, Dh)
        self.position_ids[row] = length
        self.size += 1
        return row, logits[0]

    def step(self, tokens):
        """Feed each active row its token (N,) at its position -> the next logits (N, V) (a view, valid until the next step)."""
        n = self.size
        if n == 0:
            raise RuntimeError("No active row to step.")
        if int(self.position_ids[:n].max()) >= self.length:
            raise ValueError(f"A row would pass the model's max_length={self.length}.")
        self.input_ids[:n, 0] = tokens
        self.generator.sessions["decode"].run_with_iobinding(self._bind(n))
        self.position_ids[:n] += 1
        return self.logits[:n, -1]

    def remove(self, row):
        """Free `row`: the last active row moves into it (its written positions copied). Returns the moved row's old index."""
        last = self.size - 1
        if not 0 <= row <= last:
            raise ValueError(f"`row` must be an active row in [0, {self.size}). Received: row={row}")
        if row != last:
            written = int(self.position_ids[last, 0])
            for cache in self.caches:
                cache[row, :, :written] = cache[last, :, :written]
            self.position_ids[row] = self.position_ids[last]
        self.size = last
        return last

    def _bind(self, n):
        """IO binding over the first n rows of every buffer (views share the buffers' memory); rebuilt when n changes."""
        if n != self._bound_size:
            session = self.generator.sessions["decode"]
            binding = session.io_binding()
            values = []
            for cache, past_name, present_name in zip(self.caches, self.generator._past_names,
                                                      self.generator._present_names):
                value = onnxruntime.OrtValue.ortvalue_from_numpy(cache[:n])  # contiguous rows: no copy
                binding.bind_ortvalue_input(past_name, value)
                binding.bind_ortvalue_output(present_name, value)
                values.append(value)
            for name, array in (("input_ids", self.input_ids), ("position_ids", self.position_ids)):
                values.append(onnxruntime.OrtValue.ortvalue_from_numpy(array[:n]))
                binding.bind_ortvalue_input(name, values[-1])
            values.append(onnxruntime.OrtValue.ortvalue_from_numpy(self.logits[:n]))
            binding.bind_ortvalue_output("logits", values[-1])
            self._binding, self._values, self._bound_size = binding, values, n  # OrtValues live with the binding
        return self._binding


class Sequence:
    """One sequence to generate: a prompt's ids and how to choose its tokens.

    Args:
        prompt_ids: list of ints (the start token included).
        max_tokens: int, the most new tokens.
        on_event: called from the scheduler's thread with ("token", id), then once with
            ("finish", reason): "stop" (a stop token), "length", "timeout", "cancelled", or
            ("error", message).
        temperature: 0 for greedy, else random sampling with `top_k`/`top_p`.
        seed: the random noise's seed (None: a fresh one); `choice` picks the noise's row, so
            choice c of seed s draws what row c of `Generator.generate(..., seed=s)` draws.
        stop_token_ids: ids that end the sequence (kept, as `Generator`).
        num_beams, length_penalty: beam search (run whole, not batched).
        deadline: `time.monotonic()` after which the sequence finishes with "timeout".
    """

    def __init__(self, prompt_ids, max_tokens, on_event, temperature=0.0, top_k=None, top_p=None, seed=None,
                 choice=0, stop_token_ids=(), num_beams=1, length_penalty=1.0, deadline=None):
        self.prompt_ids, self.max_tokens, self.on_event = list(prompt_ids), int(max_tokens), on_event
        self.temperature, self.top_k, self.top_p = float(temperature), top_k, top_p
        if seed is None and self.temperature > 0:
            seed = int(np.random.randint(2**31))
        self.noise_seed = None if seed is None else runtime._seed_to_int32(seed)
        self.choice, self.stop_token_ids = int(choice), tuple(stop_token_ids)
        self.num_beams, self.length_penalty, self.deadline = int(num_beams), float(length_penalty), deadline
        self.generated = []
        self.cancelled = False  # set by any thread; the scheduler frees the row at the next step boundary

    def cancel(self):
        self.cancelled = True

    def pick(self, logits):
        """Logits (V,) of position `len(prompt) + len(generated)` -> the chosen token."""
        if self.temperature <= 0:
            return int(np.argmax(logits))
        position = len(self.prompt_ids) + len(self.generated)
        uniform = runtime._uniform_noise(self.noise_seed, position, self.choice + 1)[-1:]  # the noise of row `choice`
        picker = runtime._Picker("random", self.temperature, self.top_k, self.top_p)
        return int(picker(logits[None], uniform)[0])

    def accept(self, token):
        """Record and announce a token -> the finish reason, or None to go on."""
        self.generated.append(token)
        self.on_event("token", token)
        if token in self.stop_token_ids:
            return "stop"
        return "length" if len(self.generated) >= self.max_tokens else None

    def interrupted(self, now):
        if self.cancelled:
            return "cancelled"
        return "timeout" if self.deadline is not None and now > self.deadline else None


class Scheduler:
    """The decoding thread: admits sequences at step boundaries and decodes all active rows together.

    Args:
        generator: a `generate.Generator` over an LM bundle.
        max_rows: int, the most sequences decoded together.
        max_queue: int, the most sequences waiting for a row; `submit` raises `QueueFull` beyond.
    """

    def __init__(self, generator, max_rows=32, max_queue=256):
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"`max_queue` must be a non-negative int. Received: max_queue={max_queue!r}")
        self.generator, self.max_queue = generator, max_queue
        self.decoder = BatchDecoder(generator, max_rows) if BatchDecoder.supports(generator) else None
        self.max_rows = max_rows if self.decoder is not None else 1
        self.waiting = collections.deque()
        self.active = []  # row r of the decoder holds active[r]
        self.steps, self.rows_decoded = 0, 0  # decode steps run, and rows over those steps (for metrics)
        self._condition = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kt-scheduler", daemon=True)

    @property
    def batched(self):
        return self.decoder is not None

    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout=None):
        """Finish what is active and waiting, then end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    def submit(self, sequence):
        with self._condition:
            if self._stopping:
                raise RuntimeError("The scheduler is stopping.")
            if len(self.waiting) >= self.max_queue:  # cancelled sequences (their clients gone) give their place up
                self.waiting = collections.deque(s for s in self.waiting if not s.cancelled)
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} sequences wait already (max_queue={self.max_queue}).")
            self.waiting.append(sequence)
            self._condition.notify()

    def queue_depth(self):
        return len(self.waiting)

    def _run(self):
        while True:
            with self._condition:
                while not self.waiting and not self.active and not self._stopping:
                    self._condition.wait()
                if self._stopping and not self.waiting and not self.active:
                    return
                admitted = []
                while self.waiting and len(self.active) + len(admitted) < self.max_rows:
                    admitted.append(self.waiting.popleft())
            try:
                if self.decoder is None:
                    for sequence in admitted:
                        self._run_whole(sequence)
                    continue
                for sequence in admitted:
                    if sequence.num_beams > 1:
                        self._run_whole(sequence)
                    else:
                        self._admit(sequence)
                if self.active:
                    self._step()
            except Exception as error:  # a failing graph run must not leave clients waiting forever
                for sequence in admitted + self.active:
                    sequence.on_event("error", f"{type(error).__name__}: {error}")
                self.active = []
                if self.decoder is not None:
                    self.decoder.size = 0

    def _admit(self, sequence):
        reason = sequence.interrupted(time.monotonic())
        if reason is None:
            row, logits = self.decoder.add(sequence.prompt_ids)
            self.active.append(sequence)
            reason = sequence.accept(sequence.pick(logits))
            if reason is not None:
                self._remove(row)
        if reason is not None:
            sequence.on_event("finish", reason)

    def _step(self):
        tokens = np.array([sequence.generated[-1] for sequence in self.active], np.int64)
        logits = self.decoder.step(tokens)  # (N, V)
        self.steps += 1
        self.rows_decoded += len(self.active)
        greedy = np.argmax(logits, axis=-1)
        now, finished = time.monotonic(), []
        for row, sequence in enumerate(self.active):
            reason = sequence.interrupted(now)
            if reason is None:
                token = int(greedy[row]) if sequence.temperature <= 0 else sequence.pick(logits[row])
                reason = sequence.accept(token)
            if reason is not None:
                finished.append((row, sequence, reason))
        for row, sequence, reason in reversed(finished):  # highest rows first: a moved row is never one still to remove
            self._remove(row)
            sequence.on_event("finish", reason)

    def _remove(self, row):
        last = self.decoder.remove(row)
        self.active[row] = self.active[last]
        self.active.pop()

    def _run_whole(self, sequence):
        """Beam search, or a bundle without continuous batching: the whole sequence in one `generate_ids` call."""
        reason = sequence.interrupted(time.monotonic())
        if reason is None:
            options = dict(stop_token_ids=list(sequence.stop_token_ids))
            if sequence.num_beams > 1:
                options.update(sampler="beam", num_beams=sequence.num_beams, length_penalty=sequence.length_penalty)
            elif sequence.temperature > 0:
                options.update(sampler="random", temperature=sequence.temperature, top_k=sequence.top_k,
                               top_p=sequence.top_p, seed=sequence.noise_seed)
            tokens = self.generator.generate_ids([sequence.prompt_ids], sequence.max_tokens, **options)[0]
            for token in tokens:
                reason = sequence.accept(int(token))
            reason = reason or "length"
        sequence.on_event("finish", reason)
