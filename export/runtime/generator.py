"""`Generator`: text (or chat messages, or ids) in, text out, with the ONNX graphs of an LM bundle.

Prompts of different lengths share a batch: the prefill graph runs the positions every prompt
has, then the decode graph runs one position at a time (`decode_loop.DecodeLoop`); no padding
enters the key/value caches. A decode(r) graph with `position_ids` writes its caches in place,
into buffers the runner allocates and binds once per generation (`_cache_buffers`). Seq2seq LMs
run the encoder graph once (it also returns the cross-attention keys/values), then the decoder
graph from the decoder start token.

Chat messages (a conversation `[{"role": ..., "content": ...}]`, or a list of them) are rendered
by the tokenizer's chat template as `transformers` renders them (`chat_template.py`, the file the
Keras tokenizer uses; needs `jinja2`), then tokenized with no special token added (the template
writes its own): the reply is what comes back.

Axes: B inputs, K beams, R = B * K rows, L token buffer length, V vocabulary, S cache length,
Hkv key/value heads, Dh head size.
"""

import os

import numpy as np
import onnxruntime

from bundle_files import chat_template, open_session, read_chat_template, read_json, read_tokenizer
import prompt_lookup
from decode_loop import DecodeLoop, stop_tokens, tile_state
from sampling import Picker, check_arguments, seed_to_int32


class Generator:
    """Generate with the ONNX graphs of a causal or seq2seq LM bundle.

    Args:
        bundle_dir: the bundle directory (defaults to the directory of this file).
        providers: ONNX Runtime execution providers (default: CPU).
        num_threads: int, ONNX Runtime intra-op threads (default: ONNX Runtime's choice).

    Example:
    >>> # Needs a bundle, written by `lm.export("out/gpt_onnx", format="onnx")`: not run by the tests.
    >>> generator = Generator("out/gpt_onnx")  # doctest: +SKIP
    >>> generator.generate(["def add("], max_new_tokens=16)  # doctest: +SKIP
    ['def add(a, b):\\n    return a + b\\n']
    """

    def __init__(self, bundle_dir=None, providers=None, num_threads=None):
        self.bundle_dir = os.path.abspath(bundle_dir or os.path.dirname(os.path.abspath(__file__)))
        self.bundle = read_json(os.path.join(self.bundle_dir, "bundle.json"))
        self.kind = self.bundle["kind"]
        if self.kind not in ("decoder", "encoder_decoder"):
            raise ValueError(
                f"This bundle holds a {self.bundle['task']} ({self.kind}): it does not generate; use "
                f"`Encoder`. Received: bundle_dir={bundle_dir!r}"
            )
        self.config = read_json(os.path.join(self.bundle_dir, "generation_config.json"))
        # N: a causal LM whose cache goes stale once its sequence passes N (longrope) feeds position N through
        # `refresh`; None for every other model (and bundles written before this entry).
        self.refresh_after = self.bundle.get("cache", {}).get("refresh_after") if self.kind == "decoder" else None
        cache = self.bundle["cache"]
        self.num_layers = cache["num_layers"]
        self._cache_shape = (cache["num_key_value_heads"], cache["head_dim"])
        self._past_names = [f"past_key_values.{i}.{p}" for i in range(self.num_layers) for p in ("key", "value")]
        self._present_names = [f"present.{i}.{p}" for i in range(self.num_layers) for p in ("key", "value")]
        self._cross_names = [f"cross_key_values.{i}.{p}" for i in range(self.num_layers) for p in ("key", "value")]
        self.sessions = {
            name: open_session(os.path.join(self.bundle_dir, graph["file"]), providers, num_threads)
            for name, graph in self.bundle["graphs"].items()
        }
        # A decode(r) graph with `position_ids` writes its caches in place (see `_cache_buffers`).
        self._step_graph = "decode" if self.kind == "decoder" else "decoder"
        step_inputs = {value.name: value for value in self.sessions[self._step_graph].get_inputs()}
        self._in_place = "position_ids" in step_inputs
        # An in-place step of several tokens per row after a past (`step_in_place`): a symbolic token axis.
        self.multi_token = self._in_place and step_inputs["input_ids"].shape[1] != 1
        self.tokenizer = read_tokenizer(self.bundle_dir)
        self.chat_template, self.special_tokens = read_chat_template(self.bundle_dir)

    # --- text in, text out ------------------------------------------------

    def generate(
        self,
        prompts,
        max_new_tokens=32,
        sampler="greedy",
        num_beams=4,
        temperature=1.0,
        top_k=None,
        top_p=None,
        seed=None,
        length_penalty=1.0,
        early_stopping=False,
        stop_token_ids="auto",
        chat_template_kwargs=None,
        draft=None,
        num_draft_tokens=None,
    ):
        """Prompts (a string or a list of strings) or chat messages -> generated texts.

        Causal LMs return each prompt followed by its continuation; seq2seq LMs return
        the target, cut at the end token. Chat messages (a conversation, a list of
        `{"role", "content"}` dicts, or a list of conversations; causal LMs with a chat
        template) return the reply only, the template rendered with `chat_template_kwargs`
        (None or a dict of its other variables, e.g. `{"enable_thinking": False}`). Special
        tokens are dropped. See `generate_ids` for the other arguments.
        """
        if self.tokenizer is None:
            raise ValueError("This bundle has no tokenizer.json: use `generate_ids` with token ids.")
        variables = chat_template.check_template_kwargs(chat_template_kwargs)
        chat = chat_template.as_conversations(prompts)
        if chat is None and variables:
            raise ValueError(
                "`chat_template_kwargs` applies to chat messages; these are prompts. Received: "
                f"chat_template_kwargs={chat_template_kwargs!r}"
            )
        if chat is not None:
            if self.kind != "decoder":
                raise ValueError("Chat messages need a causal LM bundle; this one holds a seq2seq LM.")
            single = chat[0]
            texts = self.apply_chat_template(chat[1], add_generation_prompt=True, **variables)
            # The template writes the special tokens (a start token too, if the model wants one).
            prompt_ids = [self.tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
        else:
            single = isinstance(prompts, str)
            prompts = [prompts] if single else list(prompts)
            if not prompts or not all(isinstance(p, str) for p in prompts):
                raise ValueError(f"`prompts` must be a string or a non-empty list of strings. Received: {prompts!r}")
            prompt_ids = [self.encode(p) for p in prompts]
        outputs = self.generate_ids(
            prompt_ids,
            max_new_tokens,
            sampler=sampler,
            num_beams=num_beams,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            stop_token_ids=stop_token_ids,
            draft=draft,
            num_draft_tokens=num_draft_tokens,
        )
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
        return chat_template.apply(
            self.chat_template, messages, add_generation_prompt, {**self.special_tokens, **template_variables}
        )

    def encode(self, text):
        """A prompt -> the ids the model reads: the start token first (causal LMs), the end token last (seq2seq
        sources)."""
        # No special tokens from the tokenizer's own post-processor (a Llama 3 tokenizer.json adds its start token):
        # the bundle's config says which ones the model reads, as the Keras preprocessor does.
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.kind == "decoder":
            return ([self.config["bos_token_id"]] if self.config.get("add_start_token") else []) + ids
        return ids + ([self.config["eos_token_id"]] if self.config.get("add_end_token") else [])

    # --- ids in, ids out --------------------------------------------------

    def generate_ids(
        self,
        prompt_ids,
        max_new_tokens=32,
        sampler="greedy",
        num_beams=4,
        temperature=1.0,
        top_k=None,
        top_p=None,
        seed=None,
        length_penalty=1.0,
        early_stopping=False,
        stop_token_ids="auto",
        interrupt=None,
        prompt_lookup_num_tokens=None,
        draft=None,
        num_draft_tokens=None,
    ):
        """Prompt id lists -> each row's new ids (int lists; the end token included when reached).

        Args:
            prompt_ids: a list of B id lists (start token included, see `encode`); for
                seq2seq LMs, the source ids.
            max_new_tokens: int, the most tokens generated per row.
            sampler: "greedy", "random" or "beam".
            num_beams, length_penalty, early_stopping: beam search (see generate.py's docstring;
                early_stopping is True, False or "never" as in Hugging Face).
            temperature, top_k, top_p, seed: random sampling.
            stop_token_ids: "auto" (the model's end tokens: its generation config's, else the
                tokenizer's end token), None (never stop early) or a list of ids, as in `lm.generate`.
            interrupt: None, or a callable asked before every decoding step; when it returns True the
                call stops there and raises `Interrupted` (a server's timeout or a client gone).
            prompt_lookup_num_tokens: None, or K: greedy decoding that drafts up to K tokens per step from earlier
                n-grams (bigrams, then single tokens) of the prompt and output and checks them in one pass
                (`prompt_lookup.py`; transformers' option of the same name): the same tokens as plain greedy.
                A causal LM whose decode graph takes several tokens; each row alone. The drafts checked and
                kept are then in `self.prompt_lookup_counts` (per row).
            draft: None, or a draft bundle (its `Generator`, or its directory): a smaller causal LM of the same
                vocabulary and at least as many positions that drafts `num_draft_tokens` tokens per step with its
                own cache, checked in one pass (`prompt_lookup.DraftProposer`; transformers' `assistant_model`,
                Keras's `draft_model`). Greedy: the same tokens as plain greedy; random: the rejection rule of
                Leviathan et al. / Chen et al., each token distributed as plain sampling's (other draws than
                plain sampling's for a seed). Each row alone; not with beam search. Counts in `self.draft_counts`.
            num_draft_tokens: None (5), or K >= 1: the draft's tokens per step (transformers'
                `num_assistant_tokens`).
        """
        check_arguments(max_new_tokens, sampler, num_beams, temperature, top_k, top_p, early_stopping)
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
        stop = stop_tokens(stop_token_ids, self.config, vocabulary_size)
        if prompt_lookup_num_tokens is not None or draft is not None or num_draft_tokens is not None:
            options = dict(sampler=sampler, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft)
            options.update(prompt_lookup_num_tokens=prompt_lookup_num_tokens, num_draft_tokens=num_draft_tokens)
            return prompt_lookup.generate_rows(self, rows, max_new_tokens, stop, interrupt, options)
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
            logits, state = self._step(
                tokens[:, 0], {**encoder_state, "past": self._empty_past(len(rows)), "position": 0}
            )
        loop = DecodeLoop(
            self, np.repeat(tokens, beams, axis=0), np.repeat(lengths, beams), max_new_tokens, pad, stop, interrupt
        )
        if beams == 1:
            noise_seed = None
            if sampler == "random":  # a fresh seed per call when none is given, as `RandomSampler(seed=None)`
                noise_seed = seed_to_int32(seed if seed is not None else np.random.randint(2**31))
            pick = Picker(sampler, temperature, top_k, top_p)
            found = loop.sample(start, logits, self._cache_buffers(state, length), pick, noise_seed)
        else:
            found = loop.beam_search(
                start,
                np.repeat(logits, beams, axis=0),
                self._cache_buffers(tile_state(state, beams), length),
                beams,
                float(length_penalty),
                early_stopping,
            )
        return [[int(t) for t in row] for row in found]

    def teacher_logits(self, ids):
        """A causal LM's logits at every position of `ids` (a list of T ints), the whole sequence fed at once
        (teacher forcing, the prefill graph) -> (T, V): row t scores the token after position t."""
        if self.kind != "decoder":
            raise ValueError("Teacher-forced logits need a causal LM bundle; this one holds a seq2seq LM.")
        tokens = np.asarray([ids], np.int64)  # (1, T)
        return self._run("prefill", {"input_ids": tokens, "attention_mask": np.ones(tokens.shape, np.int64)})["logits"][
            0
        ]

    # --- the graphs -------------------------------------------------------

    def refresh(self, tokens, length):
        """Positions [0, T) of every row again, into new caches of `length` positions: tokens (R, T) -> (logits of
        position T (R, V), state). A longrope model's step past its original length (see `refresh_after`)."""
        logits, state = self._prefill(tokens)
        return logits, self._cache_buffers(state, length)

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
        feeds = {
            "input_ids": np.zeros((rows, 1), np.int64),
            "position_ids": np.zeros((rows, 1), np.int64),
            "logits": np.zeros((rows, 1, self.bundle["vocabulary_size"]), np.float32),
        }
        values = {name: onnxruntime.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
        binding.bind_ortvalue_input("input_ids", values["input_ids"])
        binding.bind_ortvalue_input("position_ids", values["position_ids"])
        binding.bind_ortvalue_output("logits", values["logits"])
        if "cross" in state:  # a row's buffer slot stays among its input's rows (see `decode_loop.reorder_state`)
            for name, array in zip(self._cross_names, state["cross"]):
                binding.bind_cpu_input(name, array)
            binding.bind_cpu_input("encoder_attention_mask", state["encoder_mask"])
        # slots: the buffer row of each row of the loop (beam search moves histories, see `reorder_state`).
        return {
            "past": [buffer for buffer, _ in buffers],
            "position": position,
            "binding": binding,
            "feeds": feeds,
            "slots": None,
            "ortvalues": (buffers, values),
        }  # OrtValues live as long as the binding

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

    def step_in_place(self, buffers, tokens, positions):
        """T new tokens per row after each row's past, their keys/values written into `buffers` in place ->
        the logits of their positions (R, T, V).

        `buffers`: 2L arrays (R, Hkv, S_buf, Dh) (C-contiguous: whole arrays or views of consecutive rows), row r's
        past in its first p_r positions; `tokens` (R, T) and `positions` (R, T), row r's at p_r .. p_r + T - 1
        (p_r + T <= S_buf). ONNX Runtime's GroupQueryAttention takes several tokens after a past only in a batch
        of one: R = 1 when T > 1, unless no row has a past. Needs `multi_token` (a decode graph whose token axis
        is symbolic) for T > 1.
        """
        if self.kind != "decoder":
            raise ValueError("`step_in_place` runs a causal LM's decode graph; this bundle holds a seq2seq LM.")
        tokens, positions = np.ascontiguousarray(tokens, np.int64), np.ascontiguousarray(positions, np.int64)
        if tokens.shape[1] > 1 and not self.multi_token:
            raise ValueError(
                f"This bundle's decode graph takes one token per row after a past (exported before multi-token "
                f"steps, or traced). Received: {tokens.shape[1]} tokens"
            )
        session = self.sessions[self._step_graph]
        binding, values = session.io_binding(), []
        for buffer, past_name, present_name in zip(buffers, self._past_names, self._present_names):
            values.append(onnxruntime.OrtValue.ortvalue_from_numpy(buffer))  # shares the buffer's memory
            binding.bind_ortvalue_input(past_name, values[-1])
            binding.bind_ortvalue_output(present_name, values[-1])
        logits = np.empty((*tokens.shape, self.bundle["vocabulary_size"]), np.float32)  # (R, T, V)
        for name, array in (("input_ids", tokens), ("position_ids", positions), ("logits", logits)):
            values.append(onnxruntime.OrtValue.ortvalue_from_numpy(array))
            (binding.bind_ortvalue_output if name == "logits" else binding.bind_ortvalue_input)(name, values[-1])
        session.run_with_iobinding(binding)
        return logits

    def _run(self, graph, feeds):
        session = self.sessions[graph]
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds)))
