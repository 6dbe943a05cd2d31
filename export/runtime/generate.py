"""Run an exported keras_transformer bundle with numpy, onnxruntime and tokenizers only.

Every ONNX bundle carries a copy of this file. From the command line:

    python BUNDLE/generate.py --prompt "def add(" --sampler greedy --max-new-tokens 32
    python BUNDLE/generate.py --prompt "def add(" --sampler beam --num-beams 4
    python BUNDLE/generate.py --prompt "def add(" --sampler random --temperature 0.8 --top-p 0.9 --seed 0
    python BUNDLE/generate.py --chat --prompt "What is 2 + 2?"     # a user message, through the chat template

From Python (with the bundle directory on `sys.path`, or this file imported by path):

    from generate import Generator
    Generator("BUNDLE").generate(["def add("], max_new_tokens=32, sampler="beam", num_beams=4)
    Generator("BUNDLE").generate([{"role": "user", "content": "Hi!"}])  # a bundle with a chat template

Chat messages (a conversation `[{"role": ..., "content": ...}]`, or a list of them) are rendered
by the tokenizer's chat template (tokenizer_config.json's "chat_template", or chat_template.jinja)
as `transformers` renders them (see `_render_chat`; needs `jinja2`), then tokenized with no
special token added (the template writes its own): the reply is what comes back.

Axes: B inputs, K beams, R = B * K rows, L token buffer length, V vocabulary.

The decoding loop is the one of `keras_transformer.samplers`, step for step, so the same
model gives the same tokens: greedy and beam search exactly, and random sampling too for
the same seed (the noise is the same hash of (seed, step, row), see `_uniform_noise`).
Prompts of different lengths share a batch: the prefill graph runs the positions every
prompt has, then the decode graph runs one position at a time, feeding a row its own prompt token until its prompt ends and its
chosen token afterwards; no padding enters the key/value caches. A row stops at its end
token (kept) or after `max_new_tokens`. A decode(r) graph with `position_ids` writes its caches
in place, into buffers the runner allocates and binds once per generation (`_cache_buffers`).

Seq2seq LMs run the encoder graph once (it also returns the cross-attention keys/values),
then the decoder graph from the decoder start token.

Samplers:
    greedy: the most likely token.
    random: a draw from softmax(logits / temperature), restricted to the `top_k` most
        likely tokens, then to the smallest set whose probability reaches `top_p`.
    beam:   Hugging Face's beam search: `num_beams` running beams scored by summed
        log-probabilities, finished hypotheses scored `sum / length ** length_penalty`,
        stopping as `early_stopping` says; the best hypothesis is returned.
"""

import argparse
import datetime
import json
import os
import sys

import numpy as np
import onnxruntime

SAMPLERS = ("greedy", "random", "beam")
# The special-token roles a chat template reads as variables (`bos_token`, ...), as in transformers.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
NEG = np.float32(-1.0e9)  # score of impossible tokens and beams (finite: no inf - inf)


class Generator:
    """Generate with the ONNX graphs of a causal or seq2seq LM bundle.

    Args:
        bundle_dir: the bundle directory (defaults to the directory of this file).
        providers: ONNX Runtime execution providers (default: CPU).
        num_threads: int, ONNX Runtime intra-op threads (default: ONNX Runtime's choice).

    Example:
    >>> generator = Generator("out/gpt_onnx")
    >>> generator.generate(["def add("], max_new_tokens=16)
    ['def add(a, b):\\n    return a + b\\n']
    """

    def __init__(self, bundle_dir=None, providers=None, num_threads=None):
        self.bundle_dir = os.path.abspath(bundle_dir or os.path.dirname(os.path.abspath(__file__)))
        self.bundle = _read_json(os.path.join(self.bundle_dir, "bundle.json"))
        self.kind = self.bundle["kind"]
        if self.kind not in ("decoder", "encoder_decoder"):
            raise ValueError(
                f"This bundle holds a {self.bundle['task']} ({self.kind}): it does not generate; use "
                f"`Encoder`. Received: bundle_dir={bundle_dir!r}"
            )
        self.config = _read_json(os.path.join(self.bundle_dir, "generation_config.json"))
        cache = self.bundle["cache"]
        self.num_layers = cache["num_layers"]
        self._cache_shape = (cache["num_key_value_heads"], cache["head_dim"])
        self._past_names = [f"past_key_values.{i}.{p}" for i in range(self.num_layers) for p in ("key", "value")]
        self._present_names = [f"present.{i}.{p}" for i in range(self.num_layers) for p in ("key", "value")]
        self._cross_names = [f"cross_key_values.{i}.{p}" for i in range(self.num_layers) for p in ("key", "value")]
        self.sessions = {
            name: _session(os.path.join(self.bundle_dir, graph["file"]), providers, num_threads)
            for name, graph in self.bundle["graphs"].items()
        }
        # A decode(r) graph with `position_ids` writes its caches in place (see `_cache_buffers`).
        self._step_graph = "decode" if self.kind == "decoder" else "decoder"
        self._in_place = any(value.name == "position_ids" for value in self.sessions[self._step_graph].get_inputs())
        self.tokenizer = None
        if os.path.isfile(os.path.join(self.bundle_dir, "tokenizer.json")):
            import tokenizers

            self.tokenizer = tokenizers.Tokenizer.from_file(os.path.join(self.bundle_dir, "tokenizer.json"))
        self.chat_template, self.special_tokens = _read_chat_template(self.bundle_dir)

    # --- text in, text out ------------------------------------------------

    def generate(self, prompts, max_new_tokens=32, sampler="greedy", num_beams=4, temperature=1.0, top_k=None,
                 top_p=None, seed=None, length_penalty=1.0, early_stopping=False, stop_token_ids="auto"):
        """Prompts (a string or a list of strings) or chat messages -> generated texts.

        Causal LMs return each prompt followed by its continuation; seq2seq LMs return
        the target, cut at the end token. Chat messages (a conversation, a list of
        `{"role", "content"}` dicts, or a list of conversations; causal LMs with a chat
        template) return the reply only. Special tokens are dropped. See `generate_ids`
        for the arguments.
        """
        if self.tokenizer is None:
            raise ValueError("This bundle has no tokenizer.json: use `generate_ids` with token ids.")
        chat = _as_conversations(prompts)
        if chat is not None:
            if self.kind != "decoder":
                raise ValueError("Chat messages need a causal LM bundle; this one holds a seq2seq LM.")
            single = chat[0]
            texts = self.apply_chat_template(chat[1], add_generation_prompt=True)
            # The template writes the special tokens (a start token too, if the model wants one).
            prompt_ids = [self.tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
        else:
            single = isinstance(prompts, str)
            prompts = [prompts] if single else list(prompts)
            if not prompts or not all(isinstance(p, str) for p in prompts):
                raise ValueError(f"`prompts` must be a string or a non-empty list of strings. Received: {prompts!r}")
            prompt_ids = [self.encode(p) for p in prompts]
        outputs = self.generate_ids(prompt_ids, max_new_tokens, sampler=sampler, num_beams=num_beams,
                                    temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                    length_penalty=length_penalty, early_stopping=early_stopping,
                                    stop_token_ids=stop_token_ids)
        if chat is not None:
            rows = outputs
        elif self.kind == "decoder":
            rows = [list(p) + list(o) for p, o in zip(prompt_ids, outputs)]
        else:
            eos = self.config.get("eos_token_id")
            rows = [list(o[: o.index(eos)]) if eos in o else list(o) for o in outputs]
        texts = self.tokenizer.decode_batch(rows, skip_special_tokens=True)
        return texts[0] if single else texts

    def apply_chat_template(self, messages, add_generation_prompt=False, **template_variables):
        """Chat messages -> the prompt string(s) the model reads, as `transformers`' `apply_chat_template`.

        Args:
            messages: a conversation (a list of `{"role", "content"}` dicts) or a list of them.
            add_generation_prompt: bool, end with the start of an assistant turn.
            **template_variables: other variables the template reads (`tools`, `documents`, ...).

        Returns:
            A string for one conversation, a list of strings for a list of them.
        """
        if self.chat_template is None:
            raise ValueError(
                f"This bundle's tokenizer has no chat template (no 'chat_template' in its tokenizer_config.json, "
                f"no chat_template.jinja), so it cannot take chat messages: pass prompt strings. Received: "
                f"bundle_dir={self.bundle_dir!r}"
            )
        chat = _as_conversations(messages)
        if chat is None:
            raise ValueError(
                "`messages` must be a conversation (a list of dicts with 'role' and 'content') or a list of them. "
                f"Received: messages of type {type(messages).__name__}"
            )
        texts = _render_chat(self.chat_template, chat[1], add_generation_prompt,
                             {**self.special_tokens, **template_variables})
        return texts[0] if chat[0] else texts

    def encode(self, text):
        """A prompt -> the ids the model reads: the start token first (causal LMs), the end token last (seq2seq sources)."""
        ids = self.tokenizer.encode(text, add_special_tokens=True).ids
        if self.kind == "decoder":
            return ([self.config["bos_token_id"]] if self.config.get("add_start_token") else []) + ids
        return ids + ([self.config["eos_token_id"]] if self.config.get("add_end_token") else [])

    # --- ids in, ids out --------------------------------------------------

    def generate_ids(self, prompt_ids, max_new_tokens=32, sampler="greedy", num_beams=4, temperature=1.0,
                     top_k=None, top_p=None, seed=None, length_penalty=1.0, early_stopping=False,
                     stop_token_ids="auto", interrupt=None):
        """Prompt id lists -> each row's new ids (int lists; the end token included when reached).

        Args:
            prompt_ids: a list of B id lists (start token included, see `encode`); for
                seq2seq LMs, the source ids.
            max_new_tokens: int, the most tokens generated per row.
            sampler: "greedy", "random" or "beam".
            num_beams, length_penalty, early_stopping: beam search (see the module docstring;
                early_stopping is True, False or "never" as in Hugging Face).
            temperature, top_k, top_p, seed: random sampling.
            stop_token_ids: "auto" (the end token), None (never stop early) or a list of ids,
                as in `lm.generate`.
            interrupt: None, or a callable asked before every decoding step; when it returns True the
                call stops there and raises `Interrupted` (a server's timeout or a client gone).
        """
        _check_arguments(max_new_tokens, sampler, num_beams, temperature, top_k, top_p, early_stopping)
        rows = [np.asarray(row, dtype=np.int64).reshape(-1) for row in prompt_ids]
        if not rows or any(row.size == 0 for row in rows):
            raise ValueError("Every prompt must hold at least one token id (the start token counts).")
        vocabulary_size = self.bundle["vocabulary_size"]
        for row in rows:
            if row.min() < 0 or row.max() >= vocabulary_size:
                raise ValueError(f"Token ids must be in [0, {vocabulary_size}). Received: {row.tolist()}")
        max_length = self.config["max_length"]
        if self.kind == "encoder_decoder":
            if max(row.size for row in rows) > max_length:
                raise ValueError(f"A source has more tokens than max_length={max_length}.")
            encoder_state = self._encode(rows)
            rows = [np.array([self.config["decoder_start_token_id"]], np.int64)] * len(rows)
        lengths = np.array([row.size for row in rows])
        if lengths.max() + max_new_tokens > max_length:
            raise ValueError(
                f"The longest prompt ({lengths.max()} tokens) plus max_new_tokens={max_new_tokens} is longer "
                f"than the model's max_length={max_length}."
            )
        beams = num_beams if sampler == "beam" else 1
        pad = self.config.get("pad_token_id") or 0
        length = int(lengths.max()) + max_new_tokens  # L: every position a row can reach
        tokens = np.full((len(rows), length), pad, np.int64)  # (B, L) prompts, right-padded
        for b, row in enumerate(rows):
            tokens[b, : row.size] = row
        start = int(lengths.min())
        if self.kind == "decoder":
            logits, state = self._prefill(tokens[:, :start])
        else:
            logits, state = self._step(tokens[:, 0], {**encoder_state, "past": self._empty_past(len(rows)), "position": 0})
        stop = _stop_tokens(stop_token_ids, self.config.get("eos_token_id"), vocabulary_size)
        loop = _Loop(self, np.repeat(tokens, beams, axis=0), np.repeat(lengths, beams), max_new_tokens, pad, stop,
                     interrupt)
        if beams == 1:
            noise_seed = None
            if sampler == "random":  # a fresh seed per call when none is given, as `RandomSampler(seed=None)`
                noise_seed = _seed_to_int32(seed if seed is not None else np.random.randint(2**31))
            pick = _Picker(sampler, temperature, top_k, top_p)
            found = loop.sample(start, logits, self._cache_buffers(state, length), pick, noise_seed)
        else:
            found = loop.beam_search(start, np.repeat(logits, beams, axis=0),
                                     self._cache_buffers(_tile_state(state, beams), length), beams,
                                     float(length_penalty), early_stopping)
        return [[int(t) for t in row] for row in found]

    # --- the graphs -------------------------------------------------------

    def _prefill(self, tokens):
        """Positions [0, T) of every row: tokens (B, T) -> (logits of position T (B, V), state)."""
        outputs = self._run("prefill", {"input_ids": tokens, "attention_mask": np.ones(tokens.shape, np.int64)})
        state = {"past": [outputs[name] for name in self._present_names], "position": tokens.shape[1]}
        return outputs["logits"][:, -1], state

    def _encode(self, rows):
        width = max(row.size for row in rows)
        ids = np.full((len(rows), width), self.config.get("pad_token_id") or 0, np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for b, row in enumerate(rows):
            ids[b, : row.size], mask[b, : row.size] = row, 1
        encoded = self._run("encoder", {"input_ids": ids, "attention_mask": mask})
        return {"cross": [encoded[name] for name in self._cross_names], "encoder_mask": mask}

    def _empty_past(self, batch):
        heads, head_dim = self._cache_shape
        shape = (batch, heads, 0, head_dim) if self._in_place else (batch, 0, heads, head_dim)
        return [np.zeros(shape, np.float32)] * len(self._past_names)

    def _cache_buffers(self, state, length):
        """Growing caches 2L x (R, S, Hkv, Dh) -> buffers 2L x (R, Hkv, L, Dh) the decode graph writes in place.

        Each buffer is bound (IO binding) as both a layer's past and its present, so a step
        writes one position into it instead of returning a copy of the whole cache; the
        token and position inputs and the logits output are bound once too, and a step
        only fills them (a seq2seq decoder's encoder keys/values and mask as well; its first
        step's caches come heads first already). Traced decode graphs keep the growing caches.
        """
        if not self._in_place:
            return state
        rows, position = state["past"][0].shape[0], state["position"]
        session = self.sessions[self._step_graph]
        binding = session.io_binding()
        heads, head_dim = self._cache_shape
        buffers = []
        for past, past_name, present_name in zip(state["past"], self._past_names, self._present_names):
            buffer = np.zeros((rows, heads, length, head_dim), np.float32)
            # prefill gives (R, S, Hkv, Dh) -> (R, Hkv, S, Dh)
            buffer[:, :, :position] = past.transpose(0, 2, 1, 3) if self.kind == "decoder" else past
            value = onnxruntime.OrtValue.ortvalue_from_numpy(buffer)  # shares the buffer's memory
            binding.bind_ortvalue_input(past_name, value)
            binding.bind_ortvalue_output(present_name, value)
            buffers.append((buffer, value))
        feeds = {"input_ids": np.zeros((rows, 1), np.int64), "position_ids": np.zeros((rows, 1), np.int64),
                 "logits": np.zeros((rows, 1, self.bundle["vocabulary_size"]), np.float32)}
        values = {name: onnxruntime.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
        binding.bind_ortvalue_input("input_ids", values["input_ids"])
        binding.bind_ortvalue_input("position_ids", values["position_ids"])
        binding.bind_ortvalue_output("logits", values["logits"])
        if "cross" in state:  # a row's buffer slot stays among its input's rows (see `_reorder_state`)
            for name, array in zip(self._cross_names, state["cross"]):
                binding.bind_cpu_input(name, array)
            binding.bind_cpu_input("encoder_attention_mask", state["encoder_mask"])
        # slots: the buffer row of each row of the loop (beam search moves histories, see `_reorder_state`).
        return {"past": [buffer for buffer, _ in buffers], "position": position, "binding": binding,
                "feeds": feeds, "slots": None, "ortvalues": (buffers, values)}  # OrtValues live as long as the binding

    def _step(self, tokens, state):
        """Feed one token per row (R,) at `state["position"]` -> (logits of the next position (R, V), new state)."""
        if "binding" in state:
            feeds, slots = state["feeds"], state["slots"]
            feeds["input_ids"][slice(None) if slots is None else slots, 0] = tokens
            feeds["position_ids"][:] = state["position"]
            self.sessions[self._step_graph].run_with_iobinding(state["binding"])
            # The logits buffer is overwritten by the next step; the loop reads it before.
            logits = feeds["logits"][:, -1] if slots is None else feeds["logits"][slots, -1]
            return logits, {**state, "position": state["position"] + 1}
        feeds = {"input_ids": tokens.reshape(-1, 1).astype(np.int64), **dict(zip(self._past_names, state["past"]))}
        if self._in_place:  # a seq2seq decoder's first step: caches of exactly S positions, grown to S + 1
            feeds["position_ids"] = np.full((tokens.shape[0], 1), state["position"], np.int64)
        if self.kind == "decoder":
            feeds["attention_mask"] = np.ones((tokens.shape[0], state["position"] + 1), np.int64)
            outputs = self._run("decode", feeds)
        else:
            feeds.update(zip(self._cross_names, state["cross"]))
            feeds["encoder_attention_mask"] = state["encoder_mask"]
            outputs = self._run("decoder", feeds)
        state = {**state, "past": [outputs[name] for name in self._present_names], "position": state["position"] + 1}
        return outputs["logits"][:, -1], state

    def _run(self, graph, feeds):
        session = self.sessions[graph]
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds)))


class _Loop:
    """The decoding loop over a token buffer (R, L): at position i, choose token i, then feed it.

    A row reads its prompt up to its length; rows may finish at different steps but stay in
    the batch until all are done.
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
            picked = pick(logits, None if seed is None else _uniform_noise(seed, i, tokens.shape[0]))
            in_prompt = i < lengths
            emitted = ~in_prompt & ~done
            token = np.where(in_prompt, tokens[:, i], np.where(done, self.pad, picked))
            tokens[:, i] = token
            done = done | (emitted & np.isin(token, self.stop)) | (i + 1 >= limits)
            if i + 1 >= tokens.shape[1] or done.all():
                break
            logits, state = self._step(tokens[:, i], state)
            i += 1
        return [_cut(tokens[r, lengths[r]: lengths[r] + self.max_new_tokens], self.stop) for r in range(len(tokens))]

    def beam_search(self, i, logits, state, beams, length_penalty, early_stopping):
        """Beam search exactly as `keras_transformer.samplers.BeamSampler` (finished store, length penalty)."""
        tokens, K = self.tokens, beams
        R, L = tokens.shape
        B, V = R // K, logits.shape[-1]
        lengths = self.lengths.reshape(B, K)[:, 0]
        beam_scores = np.concatenate([np.zeros((B, 1), np.float32), np.full((B, K - 1), NEG, np.float32)], axis=1)
        done = np.zeros(B, bool)
        finished_tokens = np.full((B, K, L), self.pad, np.int64)
        finished_scores = np.full((B, K), 2 * NEG, np.float32)
        finished_valid = np.zeros((B, K), bool)
        finished_ends = np.zeros((B, K), np.int64)
        num_candidates = min(max(2, 1 + len(self.stop)) * K, K * V)
        rank = np.arange(num_candidates)[None, :]
        while True:
            scores = _log_softmax(logits)  # (R, V)
            generated = i + 1 - lengths  # (B,)
            in_prompt = i < lengths
            active = ~in_prompt & ~done
            at_limit = generated >= self.max_new_tokens
            total = scores.reshape(B, K, V)
            total += beam_scores[:, :, None]
            total = total.reshape(B, K * V)
            top_scores, top_index = _top_k(total, num_candidates)  # (B, C)
            top_beam, top_token = top_index // V, top_index % V
            finishes = np.isin(top_token, self.stop) | at_limit[:, None]
            full = finished_valid.all(axis=1)
            accepting = active & ~full if early_stopping is True else active
            new_valid = finishes & (rank < K) & accepting[:, None] & (top_scores > NEG / 2)
            length = np.maximum(generated, 1).astype(np.float32)[:, None]
            new_scores = np.where(new_valid, top_scores / length ** np.float32(length_penalty), 2 * NEG)
            candidate_tokens = np.take_along_axis(tokens.reshape(B, K, L), top_beam[:, :, None], axis=1).copy()
            candidate_tokens[:, :, i] = top_token
            merged_scores = np.concatenate([finished_scores, new_scores.astype(np.float32)], axis=1)
            finished_scores, keep = _top_k(merged_scores, K)
            finished_valid = np.take_along_axis(np.concatenate([finished_valid, new_valid], axis=1), keep, axis=1)
            finished_tokens = np.take_along_axis(np.concatenate([finished_tokens, candidate_tokens], axis=1),
                                                 keep[:, :, None], axis=1)
            ends = np.concatenate([finished_ends, np.full((B, num_candidates), i + 1)], axis=1)
            finished_ends = np.take_along_axis(ends, keep, axis=1)

            running = np.where(finishes, top_scores + NEG, top_scores)
            new_beam_scores, pick = _top_k(running, K)
            next_beam = np.take_along_axis(top_beam, pick, axis=1)
            next_token = np.take_along_axis(top_token, pick, axis=1)

            if early_stopping == "never" and length_penalty > 0:
                best_length = np.float32(self.max_new_tokens)
            else:
                best_length = np.maximum(generated, 1).astype(np.float32)
            best_possible = new_beam_scores[:, 0] / best_length ** np.float32(length_penalty)
            all_valid = finished_valid.all(axis=1)
            worst = np.where(all_valid, finished_scores.min(axis=1), NEG)
            now_done = at_limit | (best_possible <= worst)
            if early_stopping is True:
                now_done = now_done | all_valid
            done = np.where(active, now_done, done)

            keep_beam = np.broadcast_to(np.arange(K)[None, :], (B, K))
            next_beam = np.where(active[:, None], next_beam, keep_beam)
            order = (np.arange(B)[:, None] * K + next_beam).reshape(-1)  # (R,)
            tokens = tokens[order]
            token = np.where(in_prompt[:, None], tokens[:, i].reshape(B, K),
                             np.where(active[:, None], next_token, self.pad))
            tokens[:, i] = token.reshape(-1)
            beam_scores = np.where(active[:, None], new_beam_scores, beam_scores)
            if i + 1 >= L or done.all():
                break
            if not np.array_equal(order, np.arange(R)):
                state = _reorder_state(state, order)
            logits, state = self._step(tokens[:, i], state)
            i += 1
        return [finished_tokens[b, 0, lengths[b]: finished_ends[b, 0]] for b in range(B)]

    def _step(self, token, state):
        if self.interrupt is not None and self.interrupt():
            raise Interrupted("generation interrupted by its caller")
        return self.generator._step(token, state)


class Interrupted(Exception):
    """`Generator.generate_ids` stopped before a step because its `interrupt` callable returned True."""


def _stop_tokens(stop_token_ids, eos, vocabulary_size):
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(f"`stop_token_ids` must be 'auto', None or a list of ids. Received: {stop_token_ids!r}")
        return () if eos is None else (int(eos),)
    if stop_token_ids is None:
        return ()
    ids = [stop_token_ids] if isinstance(stop_token_ids, (int, np.integer)) else list(stop_token_ids)
    if not all(isinstance(t, (int, np.integer)) and 0 <= t < vocabulary_size for t in ids):
        raise ValueError(f"`stop_token_ids` must hold ids in [0, {vocabulary_size}). Received: {stop_token_ids!r}")
    return tuple(int(t) for t in ids)


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
    candidate, and it costs a max over the row instead of a partition (1.6 ms for 8 x 32000).
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
            maxima = np.concatenate([maxima, values[:, size * chunks:].max(axis=-1, keepdims=True)], axis=-1)
        kth = -np.partition(-maxima, k - 1, axis=-1)[:, k - 1: k]  # (rows, 1) <= the k-th largest value
    else:
        kth = -np.partition(-values, k - 1, axis=-1)[:, k - 1: k]  # (rows, 1) the k-th largest value
    index = np.empty((values.shape[0], k), np.int64)
    for row in range(values.shape[0]):
        candidates = np.flatnonzero(values[row] >= kth[row])
        order = np.lexsort((candidates, -values[row, candidates]))[:k]  # by value, then index
        index[row] = candidates[order]
    return np.take_along_axis(values, index, axis=-1), index


def _log_softmax(logits):
    logits = logits.astype(np.float32, copy=False)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return shifted


def _softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def _tile_state(state, beams):
    """Every row becomes K rows: (B, ...) -> (B * K, ...)."""
    tiled = {**state, "past": [np.repeat(array, beams, axis=0) for array in state["past"]]}
    if "cross" in state:
        tiled["cross"] = [np.repeat(array, beams, axis=0) for array in state["cross"]]
        tiled["encoder_mask"] = np.repeat(state["encoder_mask"], beams, axis=0)
    return tiled


def _reorder_state(state, rows):
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


# The noise of random sampling: the numpy twin of `keras_transformer/samplers/noise.py` (this file
# must not import Keras), held equal to it by tests/samplers/test_noise.py.


def _mix(x):
    """lowbias32 on uint32 arrays (multiplications wrap modulo 2**32)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def _uniform_noise(seed, step, num_rows):
    """Step `step`'s noise (R,) float32 in (0, 1]: entry r a hash of (seed, step, r) only."""
    return _noise(seed, step, np.arange(num_rows, dtype=np.uint32))


def _noise(seeds, steps, rows):
    """The noise of (seed, step, row) triples, int arrays or ints broadcast together, float32 in (0, 1].

    `batching.py` draws rows of different seeds and steps in one call (continuous batching).
    """
    h = _mix(np.atleast_1d(np.asarray(seeds, np.int32)).view(np.uint32) ^ np.uint32(0x9E3779B9))  # arrays wrap silently
    h = _mix(h ^ np.atleast_1d(np.asarray(steps, np.int32)).view(np.uint32))
    h = _mix(h ^ np.atleast_1d(np.asarray(rows, np.uint32)))
    return ((h >> np.uint32(8)) + np.uint32(1)).astype(np.float32) * np.float32(2.0**-24)


def _seed_to_int32(seed):
    seed = int(seed) % 2**32
    return seed - 2**32 if seed >= 2**31 else seed


class _Picker:
    """Chooses one token per row from logits (R, V): greedy, or random as `RandomSampler`."""

    def __init__(self, sampler, temperature, top_k, top_p):
        self.sampler = sampler
        self.temperature = np.float32(temperature)
        self.top_k = top_k
        self.top_p = top_p

    def __call__(self, logits, uniform):
        if self.sampler != "random":
            return np.argmax(logits, axis=-1)
        logits = logits.astype(np.float32) / self.temperature
        vocabulary_size = logits.shape[-1]
        if self.top_k is not None and self.top_k < vocabulary_size:
            kth = -np.sort(-logits, axis=-1)[:, self.top_k - 1: self.top_k]  # the k-th largest logit
            logits = np.where(logits < kth, NEG, logits)
        if self.top_p is not None and self.top_p < 1:
            descending = -np.sort(-logits, axis=-1)
            probabilities = _softmax(descending)
            before = np.cumsum(probabilities, axis=-1) - probabilities  # mass of the more likely tokens
            threshold = np.where(before < np.float32(self.top_p), descending, -NEG).min(axis=-1, keepdims=True)
            logits = np.where(logits < threshold, NEG, logits)
        # Inverse CDF: the first token whose cumulative probability reaches uniform * total.
        probabilities = _softmax(logits)
        cdf = np.where(probabilities > 0, np.cumsum(probabilities, axis=-1), np.float32(-1.0))
        target = uniform[:, None] * cdf.max(axis=-1, keepdims=True)
        return np.argmax(cdf >= target, axis=-1)


def _check_arguments(max_new_tokens, sampler, num_beams, temperature, top_k, top_p, early_stopping):
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be a positive int. Received: max_new_tokens={max_new_tokens!r}")
    if sampler == "beam":
        if isinstance(num_beams, bool) or not isinstance(num_beams, (int, np.integer)) or num_beams < 1:
            raise ValueError(f"`num_beams` must be a positive int. Received: num_beams={num_beams!r}")
        if early_stopping not in (True, False, "never"):
            raise ValueError(f"`early_stopping` must be True, False or 'never'. Received: early_stopping={early_stopping!r}")
    if sampler == "random":
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
            raise ValueError(f"`top_k` must be a positive int or None. Received: top_k={top_k!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"`top_p` must be in (0, 1] or None. Received: top_p={top_p!r}")


class Encoder:
    """Run the graph of an encoder bundle (BERT tasks) on texts or text pairs.

    Texts are packed as BERT reads them: [CLS] a [SEP] (b [SEP]), segment ids 0 then 1,
    right-padded to the longest; a masked LM's `mask_positions` are where the [MASK]
    tokens are.

    Args:
        bundle_dir: the bundle directory (defaults to the directory of this file).
        providers, num_threads: as `Generator`.

    Example:
    >>> Encoder("out/bert_onnx")(["a good film"])["logits"].shape
    (1, 2)
    """

    def __init__(self, bundle_dir=None, providers=None, num_threads=None):
        self.bundle_dir = os.path.abspath(bundle_dir or os.path.dirname(os.path.abspath(__file__)))
        self.bundle = _read_json(os.path.join(self.bundle_dir, "bundle.json"))
        if self.bundle["kind"] != "encoder":
            raise ValueError(f"This bundle holds a {self.bundle['task']}: use `Generator`. Received: bundle_dir={bundle_dir!r}")
        self.config = _read_json(os.path.join(self.bundle_dir, "preprocessor_config.json"))
        self.session = _session(os.path.join(self.bundle_dir, self.bundle["graphs"]["encoder"]["file"]), providers,
                                num_threads)
        import tokenizers

        self.tokenizer = tokenizers.Tokenizer.from_file(os.path.join(self.bundle_dir, "tokenizer.json"))

    def pack(self, texts, pairs=None):
        """Texts (and second segments) -> the graph's inputs {token_ids, segment_ids, padding_mask}, int64."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        pairs = None if pairs is None else ([pairs] if isinstance(pairs, str) else list(pairs))
        cls, sep, pad = self.config["cls_token_id"], self.config["sep_token_id"], self.config["pad_token_id"]
        rows = []
        for i, text in enumerate(texts):
            ids = [cls] + self._ids(text) + [sep]
            types = [0] * len(ids)
            if pairs is not None:
                second = self._ids(pairs[i]) + [sep]
                ids, types = ids + second, types + [1] * len(second)
            if len(ids) > self.config["max_length"]:
                raise ValueError(f"Text {i} has {len(ids)} tokens, more than max_length={self.config['max_length']}.")
            rows.append((ids, types))
        width = max(len(ids) for ids, _ in rows)
        feeds = {
            "token_ids": np.full((len(rows), width), pad, np.int64),
            "segment_ids": np.zeros((len(rows), width), np.int64),
            "padding_mask": np.zeros((len(rows), width), np.int64),
        }
        for i, (ids, types) in enumerate(rows):
            feeds["token_ids"][i, : len(ids)] = ids
            feeds["segment_ids"][i, : len(ids)] = types
            feeds["padding_mask"][i, : len(ids)] = 1
        return feeds

    def __call__(self, texts, pairs=None):
        """Texts -> {output name: array}: sequence_output (B, T, D), pooled_output (B, D), logits."""
        feeds = self.pack(texts, pairs)
        names = [i.name for i in self.session.get_inputs()]
        if "mask_positions" in names:
            mask_id = self.tokenizer.token_to_id("[MASK]")
            positions = [np.flatnonzero(row == mask_id) for row in feeds["token_ids"]]
            feeds["mask_positions"] = np.zeros((len(positions), max(1, max(len(p) for p in positions))), np.int64)
            for i, p in enumerate(positions):
                feeds["mask_positions"][i, : len(p)] = p
        outputs = [o.name for o in self.session.get_outputs()]
        return dict(zip(outputs, self.session.run(outputs, {n: feeds[n] for n in names})))

    def _ids(self, text):
        return self.tokenizer.encode(text, add_special_tokens=True).ids


# --- chat templates: the rendering of keras_transformer/tokenizers/chat_template.py, in one file --------


def _read_chat_template(bundle_dir):
    """-> (the chat template or None, {special-token role: string}) from the bundle's tokenizer files."""
    config_path = os.path.join(bundle_dir, "tokenizer_config.json")
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    special = {name: config[name] for name in SPECIAL_TOKEN_NAMES if isinstance(config.get(name), str)}
    template_path = os.path.join(bundle_dir, "chat_template.jinja")
    if os.path.isfile(template_path):
        with open(template_path, encoding="utf-8") as file:
            return file.read(), special
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one
        template = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}.get("default")
    return (template if isinstance(template, str) else None), special


def _as_conversations(inputs):
    """-> (single, list of conversations) for chat messages, None for anything else; malformed messages are errors."""
    if isinstance(inputs, dict):
        raise ValueError(f"Chat messages must come as a list (a conversation): wrap the message. Received: {inputs!r}")
    if not isinstance(inputs, (list, tuple)) or not inputs:
        return None
    if isinstance(inputs[0], dict):
        single, conversations = True, [inputs]
    elif isinstance(inputs[0], (list, tuple)) and inputs[0] and isinstance(inputs[0][0], dict):
        single, conversations = False, list(inputs)
    else:
        return None
    for c, conversation in enumerate(conversations):
        where = "the conversation" if single else f"conversation {c}"
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise ValueError(f"Each conversation must be a non-empty list of messages. Received: {where} = {conversation!r}")
        for m, message in enumerate(conversation):
            if (not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message
                    or not isinstance(message["content"], (str, list, type(None)))):
                raise ValueError('Each chat message must be a dict with a string "role" and a "content" (a string, '
                                 f"a list of parts or None). Received: message {m} of {where} = {message!r}")
    return single, [list(conversation) for conversation in conversations]


def _render_chat(template, conversations, add_generation_prompt, variables):
    """Each conversation -> its prompt string: a sandboxed jinja2 environment set up as transformers sets it."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < (3, 1, 6):
        raise ValueError(f"Chat templates need jinja2 >= 3.1.6 (older ones can be escaped). Received: {jinja2.__version__}")

    class Generation(jinja2.ext.Extension):  # `{% generation %}` blocks render their body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class TemplateDict:  # `dict(...)` without the class itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):  # `namespace(...)` without underscore attributes
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"A chat template cannot set an underscore attribute: {name!r}")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, dict=TemplateDict(), namespace=Namespace,
                               strftime_now=lambda format: datetime.datetime.now().strftime(format))
    try:
        compiled = environment.from_string(template)
        variables = {"tools": None, "documents": None, **_plain(variables)}
        return [compiled.render(messages=_plain(conversation), add_generation_prompt=bool(add_generation_prompt),
                                **variables) for conversation in conversations]
    except jinja2.TemplateError as error:
        raise ValueError(f"The chat template could not render these messages: {error}") from error


def _plain(value):
    """A copy made of plain JSON types (what a sandboxed template may see); other objects become "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return f"<{type(value).__name__}>"


def _session(path, providers, num_threads):
    options = onnxruntime.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = int(num_threads)
    # A decode step is a few dozen short kernels: threads that sleep between them spend more
    # time waking up than computing (measured on 2 idle cores: spinning made decoding 1.2-1.6x
    # faster). Spinning threads steal the CPU, though, from the Python loop between the
    # per-token runs and from other work on a busy machine (where long spins halved the
    # speed): they spin at most 20 microseconds, and only inside a run.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.intra_op.spin_duration_us", "20")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return onnxruntime.InferenceSession(path, options, providers=providers or ["CPUExecutionProvider"])


def _read_json(path):
    if not os.path.isfile(path):
        raise ValueError(f"Not a keras_transformer bundle: missing {path}")
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Generate text with this keras_transformer bundle.")
    parser.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)), help="bundle directory")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    parser.add_argument("--sampler", default="greedy", choices=SAMPLERS)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat", action="store_true",
                        help="each prompt is a user message, rendered by the bundle's chat template; prints the reply")
    args = parser.parse_args(argv)
    if _read_json(os.path.join(args.bundle, "bundle.json"))["kind"] == "encoder":
        outputs = Encoder(args.bundle)(args.prompt)
        print(json.dumps({"logits": outputs["logits"].tolist()}))
        return 0
    generator = Generator(args.bundle)
    prompts = [[{"role": "user", "content": prompt}] for prompt in args.prompt] if args.chat else args.prompt
    texts = generator.generate(prompts, max_new_tokens=args.max_new_tokens, sampler=args.sampler,
                               num_beams=args.num_beams, temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, seed=args.seed)
    for text in texts:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
