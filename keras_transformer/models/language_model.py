"""LanguageModel: the base of the tasks that generate tokens (CausalLM, Seq2SeqLM).

It holds what both share, once: the sampler `compile` sets, and the one `generate` signature and
its documentation. The decoding itself is `keras_transformer.decoding.generate`.
"""

from keras_transformer import decoding, samplers
from keras_transformer.models.task import Task
from keras_transformer.tokenizers import chat_template


class LanguageModel(Task):
    """A task that generates tokens with `generate` (see `CausalLM`, `Seq2SeqLM`).

    Subclasses may override `_generate(inputs, options)` to prepare the inputs or shape the
    results (CausalLM renders chat messages there); `options` is a `decoding.GenerateOptions`.

    `generation_config` (a `decoding.GenerationConfig`, its config dict, or None; a checkpoint's
    generation_config.json when converted from Hugging Face) holds the model's own defaults for `generate`:
    its stop tokens, sampler and repetition penalty. It is saved with the task.
    """

    def __init__(self, *args, generation_config=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.generation_config = decoding.GenerationConfig.from_config(generation_config)

    def get_config(self):
        config = super().get_config()
        if self.generation_config is not None:
            config["generation_config"] = self.generation_config.get_config()
        return config

    def compile(self, *args, sampler=None, **kwargs):
        """Compile as `Task.compile`; `sampler` (a name or a `Sampler`) sets the default of `generate`."""
        super().compile(*args, **kwargs)
        if sampler is not None:
            self.sampler = samplers.get(sampler)

    def generate(
        self,
        inputs,
        max_new_tokens=32,
        sampler=None,
        stop_token_ids="auto",
        min_new_tokens=0,
        repetition_penalty=None,
        no_repeat_ngram_size=0,
        streamer=None,
        return_dict=False,
        output_logits=False,
        prompt_lookup_num_tokens=None,
        max_matching_ngram_size=None,
        draft_model=None,
        num_draft_tokens=None,
        json_schema=None,
        regex=None,
        grammar=None,
        chat_template_kwargs=None,
    ):
        """Continue prompts (a causal LM) or transduce sources (an encoder-decoder LM), one token
        at a time, with a key/value cache.

        The prompts are prefilled once, then a compiled loop (one per batch size and
        length bucket, reused across calls) feeds one token per step. Prompts of
        different lengths may share a batch. An encoder-decoder LM encodes its sources
        once (the encoder output and every layer's cross-attention keys/values, repeated
        per beam) and decodes from the preprocessor's `decoder_start_token_id`.

        Args:
            inputs: a string or a list of strings (needs a preprocessor; returns
                strings), or token ids: a 1-D int array / list (one prompt), a 2-D int
                array or a list of id lists (ragged prompts allowed). Ids come back in
                the same container: arrays are right-padded with the pad id. Or chat
                messages, with a tokenizer that has a chat template: a conversation
                `[{"role": "user", "content": "..."}, ...]` or a list of them; each is
                rendered by the template with the assistant's turn opened
                (`tokenizer.apply_chat_template(..., add_generation_prompt=True)`) and
                tokenized as written (the template's own start token, no other), and
                the reply comes back: the new text only, not the conversation (causal LMs).
                For an encoder-decoder LM, the sources: strings (results are strings) or
                encoder token ids (results are the decoder's ids: the start token, then the
                generated tokens).
            max_new_tokens: int >= 1, new tokens per prompt at most.
            sampler: None (the one set by `compile`, else the model's `generation_config`'s,
                else greedy), a name ("greedy", "random", "top_k", "top_p", "beam") or a `Sampler`.
            stop_token_ids: "auto" (the model's `generation_config`'s end tokens, else the
                tokenizer's end token), None (never stop early) or a list of ids. Each row
                stops at its first stop token, which is kept in the ids.
            min_new_tokens: int, stop tokens are banned until a row has this many
                new tokens.
            repetition_penalty: float > 0, Hugging Face's (CTRL) penalty on tokens
                already in the row: positive logits are divided by it, negative ones
                multiplied. None: the model's `generation_config`'s, else 1.0 (none).
            no_repeat_ngram_size: int, if > 0 no n-gram of this size occurs twice in
                a row (prompt included).
            streamer: None or a callable, called after every step with the (B,)
                numpy array of the token each row just produced (-1 for a row that
                produced none: finished, or still inside its longer prompt). Not with
                beam search.
            return_dict: bool, return `{"outputs", "scores", "logits", "logprobs"}`: "scores" are
                beam search's (B, n) normalized scores (else None).
            output_logits: bool, with `return_dict`: "logits" holds, per row, the raw
                logits (N, V) of each of its N generated tokens (not with beam search), and
                "logprobs" the (N,) log-softmax of those raw logits at the chosen tokens (else None).
                The loop then keeps a (B, L, V) buffer: mind large vocabularies.
            prompt_lookup_num_tokens: None, or K >= 1: speculative decoding by prompt lookup (transformers'
                `prompt_lookup_num_tokens`). Each step copies K draft tokens from where the last n-gram of
                the row occurred before, in the prompt and the output so far (for an encoder-decoder LM, in
                the source, then the output), and the model checks them all in one cached step of K + 1
                tokens. Greedy: the tokens are exactly plain greedy decoding's. A `RandomSampler`: the
                rejection rule of Leviathan et al. / Chen et al. (each draft kept with the probability the
                model, after the processors, temperature, top-k and top-p, gives it; else a token drawn
                from the rest), so each token is distributed as the sampler's own; seeded, reproducible. With
                several prompts, all rows advance by the smallest number of tokens any row accepted (a
                row that agreed further proposes those tokens again). Beam search: a ValueError. The
                latest earlier occurrence of the n-gram is followed (transformers: the earliest).
            max_matching_ngram_size: None (2), or N >= 1: prompt lookup's longest n-gram matched (tried
                from N down to 1, the latest occurrence), transformers' `max_matching_ngram_size`.
            draft_model: None, or a smaller language model of the same kind (causal or seq2seq), with the
                same vocabulary and at least as many positions, that proposes the drafts: K greedy steps of
                its own cache per verify pass (transformers' `assistant_model`). Greedy: exactly plain greedy
                decoding's tokens; a `RandomSampler`: the draft draws through the sampler's temperature, top-k
                and top-p, and the rejection rule keeps each token distributed as the sampler's own.
            num_draft_tokens: None (5), or K >= 1: a draft model's tokens per step (transformers'
                `num_assistant_tokens`, here fixed for the call).
            json_schema, regex, grammar: None, or one of them (a JSON schema dict, a regex, Lark or GBNF text):
                the output follows it (a causal LM with a preprocessor; llguidance masks each step's logits, the
                end token allowed exactly when the grammar accepts). It runs `CausalLM.generate_constrained`'s
                host-stepped loop, not the compiled one (slower: benchmarks/RESULTS.md, "Constrained decoding"),
                with greedy or a `RandomSampler`'s temperature and seed, and no other option of this list.
            chat_template_kwargs: None, or a dict of other variables the chat template reads, for chat
                messages only, as `transformers`' `apply_chat_template(..., **kwargs)` (and a server's
                `chat_template_kwargs`): e.g. `{"enable_thinking": False}` for Qwen3, `{"tools": [...]}`.

        Returns:
            prompt + continuation for each prompt, in the form of `inputs` (for chat
            messages: the reply, a string per conversation); with a
            `BeamSampler(num_return_sequences=n > 1)`, n results per prompt.

        Example:
        >>> from keras_transformer.models import GPTCausalLM, T5Seq2SeqLM
        >>> lm = GPTCausalLM.from_preset("gpt_stdlib")  # trained on the Python standard library
        >>> lm.generate("for i in range(", max_new_tokens=8)
        'for i in range(x)\\n\\n\\ndef _convert'
        >>> lm.generate([[1, 5, 9], [1, 7]], max_new_tokens=8, sampler="beam")  # token ids in, token ids out
        [[1, 5, 9, 320, 338, 460, 588, 514, 274, 301, 264], [1, 7, 442, 353, 274, 14, 355, 12, 289, 14]]
        >>> # A chat model's preset brings its chat template; this model is given a minimal one:
        >>> lm.preprocessor.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        >>> lm.generate([{"role": "user", "content": "for i in range("}], max_new_tokens=8)  # the reply only
        'x)\\n        return (x, b'
        >>> t5 = T5Seq2SeqLM.from_preset("t5_reverse")  # a Seq2SeqLM, trained to reverse digits
        >>> t5.generate(["1 2 3", "3 2 1 4"], max_new_tokens=8, sampler="beam")
        ['3 2 1', '4 1 2 3']
        """
        options = decoding.GenerateOptions(
            max_new_tokens=max_new_tokens,
            sampler=sampler,
            stop_token_ids=stop_token_ids,
            min_new_tokens=min_new_tokens,
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            streamer=streamer,
            return_dict=return_dict,
            output_logits=output_logits,
            prompt_lookup_num_tokens=prompt_lookup_num_tokens,
            max_matching_ngram_size=max_matching_ngram_size,
            draft_model=draft_model,
            num_draft_tokens=num_draft_tokens,
        )
        variables = None if chat_template_kwargs is None else chat_template.check_template_kwargs(chat_template_kwargs)
        constraints = {"json_schema": json_schema, "regex": regex, "grammar": grammar}
        if any(value is not None for value in constraints.values()):
            return self._generate_constrained(inputs, options, constraints, variables)
        if variables is None:
            return self._generate(inputs, options)
        return self._generate(inputs, options, chat_template_kwargs=variables)

    def _generate_constrained(self, inputs, options, constraints, chat_template_kwargs=None):
        """`generate` under a grammar (`json_schema`, `regex` or `grammar`): causal LMs only (CausalLM)."""
        del inputs, options, chat_template_kwargs
        given = sorted(name for name, value in constraints.items() if value is not None)
        raise ValueError(
            f"Constrained generation ({', '.join(given)}) is for causal LMs; {type(self).__name__} does not take it."
        )

    def _generate(self, inputs, options, chat_template_kwargs=None):
        """`generate` with its keyword arguments as a `decoding.GenerateOptions` (and the chat template's
        variables, which only a causal LM given chat messages reads)."""
        if chat_template_kwargs is not None:
            raise ValueError(
                f"`chat_template_kwargs` applies to chat messages, which {type(self).__name__} does not take. "
                f"Received: chat_template_kwargs={chat_template_kwargs!r}"
            )
        return decoding.generate_with(self, inputs, options)
