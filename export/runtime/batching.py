"""Continuous batching over an LM bundle: numpy, onnxruntime and tokenizers only.

Every ONNX bundle carries a copy of this file next to `generate.py`, whose graphs
(`generator.Generator`) and samplers (`sampling.py`) it reuses. `serve.py` drives it; from Python:

    from generate import Generator
    from batching import Scheduler, Sequence
    scheduler = Scheduler(Generator("BUNDLE"), max_rows=32).start()
    scheduler.submit(Sequence(prompt_ids, max_tokens=16, on_event=print))

Axes: N active rows, M the most rows, V vocabulary.

The cache rows themselves (prefill, insert, step, remove; M rows of in-place caches) are
`cache_rows.BatchDecoder`; this file decides which sequence holds which row, and when.

`Scheduler` prefills waiting sequences on one thread (up to M rows held in all) while another
runs the batch (their graph runs overlap: ONNX Runtime releases the GIL). A thread of its own
answers waiting sequences at their deadlines: one queued behind a full batch (or a running beam
search) finishes with "timeout" on time and leaves the queue, never prefilled or decoded. At each step boundary
the batch thread puts the prefilled sequences into free rows, runs one step for all, hands each row its
token (`on_event`), removes rows that stopped,
were cancelled (a client that went away) or ran past their deadline, and calls `on_step` once
(a server wakes its readers once per step, not once per token and row). Tokens are chosen for all rows
at once (`choose`): one argmax for the greedy rows, and random rows drawn together per
(temperature, top-k, top-p), each with its own noise (seed, position, choice), so a seeded
answer does not depend on its neighbours. Each row's arithmetic is its own (per-row attention,
row-wise matrix products), so a greedy answer is the same alone or in a batch (tested).

Beam search (its K beams reorder their caches every step), speculative decoding (`prompt_lookup.py`, prompt
lookup's or a draft bundle's drafts: its verify passes take several tokens, a row at a time) and bundles
without continuous batching (traced decode graphs, which grow their caches) run on a second thread, beside
the batch: a request at a time, its n choices together, through `Generator.generate_ids` (speculation: each
choice through `prompt_lookup.serve`), which asks before every step whether all its choices ran past their
deadline or were cancelled, and then stops.
"""

import collections
import heapq
import itertools
import os
import sys
import threading
import time

# The runtime's other modules sit next to this file (a bundle's directory).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402

from cache_rows import BatchDecoder  # noqa: E402
from prefix_cache import PrefixCache  # noqa: E402
import prompt_lookup  # noqa: E402
from decode_loop import Interrupted  # noqa: E402
from sequence import Sequence, choose  # noqa: E402

__all__ = ["BatchDecoder", "PREFIX_CACHE_TOKENS", "QueueFull", "Scheduler", "Sequence", "choose"]
PREFIX_CACHE_TOKENS = 4096  # the prefix cache's default budget, in prompt positions
PREFIX_BLOCK = 16  # positions per prefix cache block
PREFILL_TOKENS = 2048  # the most prompt positions prefilled in one graph run (several prompts of one length)


class QueueFull(Exception):
    """More sequences wait than the scheduler's `max_queue`."""


class Scheduler:
    """The decoding threads: one admits sequences at step boundaries and decodes all active rows together;
    another runs sequences that are not batched (beam search; every sequence of a bundle without
    continuous batching) whole, one at a time, so they never hold the batch up; a third finishes waiting
    sequences at their deadlines.

    Args:
        generator: a `generate.Generator` over an LM bundle.
        max_rows: int, the most sequences decoded together.
        max_queue: int, the most sequences waiting (both kinds); `submit` raises `QueueFull` beyond.
        on_step: None, or called from a decoding thread after each step's events (tokens of
            every row, finishes) have gone out, with the number of rows stepped: a server wakes
            its readers once per step, or once per few steps of a large batch.
        prefix_cache_tokens: int >= 0, the most prompt positions whose keys/values are kept for later prompts
            that start the same (`prefix_cache.PrefixCache`, blocks of `PREFIX_BLOCK` tokens); 0 keeps none.
            Only a causal LM's batched rows use it, with a decode graph that takes several tokens per row.
        draft: None, or the draft bundle's `Generator` that sequences with `num_draft_tokens` draft with.
    """

    def __init__(
        self, generator, max_rows=32, max_queue=256, on_step=None, prefix_cache_tokens=PREFIX_CACHE_TOKENS, draft=None
    ):
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"`max_queue` must be a non-negative int. Received: max_queue={max_queue!r}")
        self.generator, self.max_queue, self.on_step, self.draft = generator, max_queue, on_step, draft
        self.decoder = BatchDecoder(generator, max_rows) if BatchDecoder.supports(generator) else None
        self.max_rows = max_rows if self.decoder is not None else 0
        tokens = prefix_cache_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(
                f"`prefix_cache_tokens` must be a non-negative int. Received: prefix_cache_tokens={tokens!r}"
            )
        cache = PrefixCache(prefix_cache_tokens, PREFIX_BLOCK)
        usable = self.decoder is not None and generator.kind == "decoder" and generator.multi_token
        self.prefix_cache = cache if usable and cache.max_blocks > 0 else None
        self.waiting = collections.deque()  # for the batch
        self.waiting_whole = collections.deque()  # to run whole
        self.active = []  # row r of the decoder holds active[r]
        self.staged = collections.deque()  # prefilled groups (sequences, logits, state) waiting for a step boundary
        self.running_whole = 0
        self.steps, self.rows_decoded = 0, 0  # decode steps run, and rows over those steps (for metrics)
        self._condition = threading.Condition()  # guards the queues and the row counts below
        self._taken = 0  # rows held: active, staged, or being prefilled (at most max_rows)
        self._prefilling = 0  # of which being prefilled
        self._stopping = self._prefill_done = False
        self._deadlines, self._order = [], itertools.count()  # heap of (deadline, order, sequence) submitted
        self._threads = [
            threading.Thread(target=self._run_whole_loop, name="kt-whole", daemon=True),
            threading.Thread(target=self._run_expiry, name="kt-expiry", daemon=True),
        ]
        if self.decoder is not None:
            self._threads += [
                threading.Thread(target=self._run_prefill, name="kt-prefill", daemon=True),
                threading.Thread(target=self._run_batch, name="kt-batch", daemon=True),
            ]

    @property
    def batched(self):
        return self.decoder is not None

    def start(self):
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout=None):
        """Finish what is active and waiting, then end the threads."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def submit(self, sequence):
        with self._condition:
            if self._stopping:
                raise RuntimeError("The scheduler is stopping.")
            if self.queue_depth() >= self.max_queue:  # cancelled sequences (their clients gone) give their place up
                self._drop([s for s in itertools.chain(self.waiting, self.waiting_whole) if s.cancelled])
            if self.queue_depth() >= self.max_queue:
                raise QueueFull(f"{self.queue_depth()} sequences wait already (max_queue={self.max_queue}).")
            (self.waiting if self.batched and sequence.batched else self.waiting_whole).append(sequence)
            sequence.queued = True
            if sequence.deadline is not None:
                heapq.heappush(self._deadlines, (sequence.deadline, next(self._order), sequence))
            self._condition.notify_all()

    def queue_depth(self):
        return len(self.waiting) + len(self.waiting_whole)

    def _drop(self, sequences):
        """Take `sequences` out of the waiting queues (the lock held)."""
        for sequence in sequences:
            sequence.queued = False
        if sequences:
            self.waiting = collections.deque(s for s in self.waiting if s.queued)
            self.waiting_whole = collections.deque(s for s in self.waiting_whole if s.queued)

    def _take(self, queue):
        """The next sequence of a waiting queue (the lock held)."""
        sequence = queue.popleft()
        sequence.queued = False
        return sequence

    def rows(self):
        """Sequences holding a row (decoding, prefilled or being prefilled) and those running whole."""
        return self._taken + self.running_whole

    def _stepped(self, rows):
        if self.on_step is not None:
            self.on_step(rows)

    # --- the batch ------------------------------------------------------------------

    def _run_prefill(self):
        """Prefills waiting sequences (those of one prompt length together) while the batch steps: the two
        threads' graph runs overlap (ONNX Runtime releases the GIL)."""
        while True:
            with self._condition:
                while not self.waiting or self._taken >= self.max_rows:
                    if self._stopping and not self.waiting:
                        self._prefill_done = True
                        self._condition.notify_all()
                        return
                    self._condition.wait()
                admitted = []
                while self.waiting and self._taken < self.max_rows:
                    admitted.append(self._take(self.waiting))
                    self._taken += 1
                self._prefilling = len(admitted)
            now, live, freed = time.monotonic(), [], 0
            for sequence in admitted:
                reason = sequence.interrupted(now)
                if reason is None:
                    live.append(sequence)
                else:
                    sequence.on_event("finish", reason)
                    freed += 1
            staged, failed = self._prefill(live)
            freed += failed
            with self._condition:
                self._taken -= freed
                self._prefilling = 0
                self.staged.extend(staged)
                self._condition.notify_all()
            if freed:
                self._stepped(0)

    def _prefill(self, sequences):
        """Prefill `sequences` -> (staged groups [(sequences, logits, state)], how many failed). A prompt that starts
        with a stored prefix is prefilled after it (one at a time: the multi-token step's batch is one row); the
        others in groups of one length. A prompt whose first block an earlier one of this call prefills waits
        for the next round, and finds it stored. Each prompt's whole blocks are stored after its prefill."""
        staged, failed, cache = [], 0, self.prefix_cache
        while sequences:
            cold, later, firsts = collections.defaultdict(list), [], set()
            for sequence in sequences:
                length, past = cache.lookup(sequence.prompt_ids) if cache is not None else (0, None)
                first = cache.first_key(sequence.prompt_ids) if cache is not None else None
                if length:
                    sequence.cached_tokens = length
                    runs = [
                        (
                            [sequence],
                            lambda s=sequence, p=past, n=length: self.decoder.prefill_after(p, s.prompt_ids[n:]),
                        )
                    ]
                    failed += self._run_groups(runs, staged)
                elif first is not None and first in firsts:
                    later.append(sequence)
                else:
                    firsts.add(first)
                    cold[len(sequence.prompt_ids)].append(sequence)
            runs = []
            for group in cold.values():  # rows of one length, PREFILL_TOKENS at most per run (its logits (k, T, V))
                size = max(1, PREFILL_TOKENS // len(group[0].prompt_ids))
                for chunk in (group[i : i + size] for i in range(0, len(group), size)):
                    runs.append((chunk, lambda g=chunk: self.decoder.prefill([s.prompt_ids for s in g])))
            failed += self._run_groups(runs, staged)
            sequences = later
        return staged, failed

    def _run_groups(self, runs, staged):
        """Run each (group, prefill) -> staged (group, logits, state), its prompts' blocks stored; -> how many
        sequences failed (each told its error: a failing graph run must not leave clients waiting forever)."""
        failed = 0
        for group, prefill in runs:
            try:
                logits, state = prefill()
            except Exception as error:
                for sequence in group:
                    sequence.on_event("error", f"{type(error).__name__}: {error}")
                failed += len(group)
                continue
            if self.prefix_cache is not None:
                for row, sequence in enumerate(group):
                    self.prefix_cache.store(sequence.prompt_ids, self.decoder.keys_values(state, row))
            staged.append((group, logits, state))
        return failed

    def _run_batch(self):
        while True:
            with self._condition:
                while not self.staged and not self.active:
                    if self._stopping and self._prefill_done:
                        return
                    self._condition.wait()
                staged = list(self.staged)
                self.staged.clear()
            try:
                self._admit(staged)
                if self.active:
                    self._step()
            except Exception as error:  # a failing graph run must not leave clients waiting forever
                for sequence in dict.fromkeys([s for group, _, _ in staged for s in group] + self.active):
                    sequence.on_event("error", f"{type(error).__name__}: {error}")
                self.active = []
                self.decoder.size = 0
                with self._condition:  # this thread holds no row any more
                    self._taken = self._prefilling + sum(len(group) for group, _, _ in self.staged)
                    self._condition.notify_all()
            self._stepped(len(self.active))

    def _admit(self, staged):
        """Put prefilled groups into free rows and choose their first tokens (a seq2seq row's comes from its
        first step)."""
        finished = []
        for group, logits, state in staged:
            first = self.decoder.insert(state)
            self.active.extend(group)
            if logits is None:
                continue
            positions = self.decoder.position_ids[first : first + len(group), 0]
            chosen = choose(group, logits, positions).tolist()
            for row, (sequence, token, row_logits) in enumerate(zip(group, chosen, logits), first):
                reason = sequence.accept(token, row_logits)
                if reason is not None:
                    finished.append((row, sequence, reason))
        self._finish(finished)

    def _step(self):
        active = self.active
        start = self.generator.config.get("decoder_start_token_id")  # a seq2seq row's first input
        tokens = np.fromiter((s.generated[-1] if s.generated else start for s in active), np.int64, len(active))  # (N,)
        logits = self.decoder.step(tokens)  # (N, V)
        self.steps += 1
        self.rows_decoded += len(active)
        chosen = choose(active, logits, self.decoder.position_ids[: len(active), 0]).tolist()
        now, finished = time.monotonic(), []
        for row, sequence in enumerate(active):
            reason = sequence.interrupted(now) or sequence.accept(chosen[row], logits[row])
            if reason is not None:
                finished.append((row, sequence, reason))
        self._finish(finished)

    def _finish(self, finished):
        """Free the rows of (row, sequence, reason) in increasing rows, and announce each finish."""
        for row, sequence, reason in reversed(finished):  # highest rows first: a moved row is never one still to remove
            last = self.decoder.remove(row)
            self.active[row] = self.active[last]
            self.active.pop()
            sequence.on_event("finish", reason)
        if finished:
            with self._condition:
                self._taken -= len(finished)
                self._condition.notify_all()

    # --- deadlines ----------------------------------------------------------------------

    def _run_expiry(self):
        """Finishes each waiting sequence at its deadline ("timeout") and takes it out of its queue, so a sequence
        queued behind a full batch or a running beam search is answered on time and never decoded. (A sequence
        holding a row is stopped at the next step.)"""
        while True:
            with self._condition:
                while True:
                    while self._deadlines and not self._deadlines[0][2].queued:  # started or dropped: forget it
                        heapq.heappop(self._deadlines)
                    if self._stopping and not self.queue_depth():
                        return
                    now = time.monotonic()
                    if self._deadlines and self._deadlines[0][0] < now:
                        break
                    self._condition.wait(self._deadlines[0][0] - now if self._deadlines else None)
                late = []
                while self._deadlines and self._deadlines[0][0] < now:
                    sequence = heapq.heappop(self._deadlines)[2]
                    if sequence.queued:
                        late.append(sequence)
                self._drop(late)
            for sequence in late:
                sequence.on_event("finish", "timeout")
            self._stepped(0)

    # --- whole sequences ---------------------------------------------------------------

    def _run_whole_loop(self):
        while True:
            with self._condition:
                while not self.waiting_whole and not self._stopping:
                    self._condition.wait()
                if not self.waiting_whole:
                    return
                # The choices of one prompt (n > 1: the same prompt and options) run together, choice c as row c.
                group = [self._take(self.waiting_whole)]
                while self.waiting_whole and self.waiting_whole[0].same_request(group[0]):
                    group.append(self._take(self.waiting_whole))
                self.running_whole = len(group)
                self._condition.notify_all()  # (the expiry thread ends once the queues are empty on stopping)
            try:
                self._run_whole(group)
            except Exception as error:
                for sequence in group:
                    sequence.on_event("error", f"{type(error).__name__}: {error}")
            self.running_whole = 0
            self._stepped(0)

    def _run_whole(self, group):
        """Sequences of one prompt and options (beam search, or a bundle without continuous batching) in one
        `generate_ids` call: choice c is row c, so a seeded draw equals `Generator.generate`'s row c."""
        now = time.monotonic()
        running = []
        for sequence in group:
            reason = sequence.interrupted(now)
            if reason is None:
                running.append(sequence)
            else:
                sequence.on_event("finish", reason)
        if not running:
            return
        first = running[0]
        if first.speculative:  # each choice alone
            for sequence in running:
                prompt_lookup.serve(self.generator, sequence, lambda: self._stepped(0), self.draft)
            return
        options = dict(stop_token_ids=list(first.stop_token_ids))
        if first.num_beams > 1:
            options.update(sampler="beam", num_beams=first.num_beams, length_penalty=first.length_penalty)
        elif first.temperature > 0:
            options.update(
                sampler="random",
                temperature=first.temperature,
                top_k=first.top_k,
                top_p=first.top_p,
                seed=first.noise_seed,
            )
        rows = 1 + max(sequence.choice for sequence in running) if first.temperature > 0 else 1  # greedy rows are equal

        def interrupt():  # every choice past its deadline or cancelled: stop before the next step
            now = time.monotonic()
            return all(sequence.interrupted(now) for sequence in running)

        try:
            found = self.generator.generate_ids(
                [first.prompt_ids] * rows, first.max_tokens, interrupt=interrupt, **options
            )
        except Interrupted:
            now = time.monotonic()
            for sequence in running:
                sequence.on_event("finish", sequence.interrupted(now) or "timeout")
            return
        for sequence in running:
            reason, tokens = None, found[sequence.choice if rows > 1 else 0]
            # Each token's logits, recomputed by the prefill graph over the prompt and the tokens (teacher forcing).
            logits = [None] * len(tokens)
            if sequence.logprobs is not None and tokens:
                ids = list(first.prompt_ids) + list(tokens[:-1])
                logits = self.generator.teacher_logits(ids)[len(first.prompt_ids) - 1 :]
            for token, row_logits in zip(tokens, logits):
                reason = sequence.accept(int(token), row_logits)
            sequence.on_event("finish", reason or "length")
