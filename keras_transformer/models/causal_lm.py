"""CausalLM: the task base of decoder-only language models (next-token prediction)."""

import keras

from keras_transformer import samplers
from keras_transformer.metrics import Perplexity
from keras_transformer.models.task import Task
from keras_transformer.tokenizers.chat_template import as_conversations


class CausalLM(Task):
    """Next-token language model: logits (B, T, V) from token ids; loss ignores padding.

    Compiled by default with AdamW, masked sparse cross-entropy, token accuracy
    and perplexity. `generate` continues prompts with a KV-cached, compiled loop
    (see `keras_transformer.samplers`).
    """

    default_learning_rate = 1e-3

    def default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), Perplexity()]

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
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        streamer=None,
        return_dict=False,
        output_logits=False,
    ):
        """Continue prompts, one token at a time, with a key/value cache.

        The prompts are prefilled once, then a compiled loop (one per batch size and
        length bucket, reused across calls) feeds one token per step. Prompts of
        different lengths may share a batch.

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
                the reply comes back: the new text only, not the conversation.
            max_new_tokens: int >= 1, new tokens per prompt at most.
            sampler: None (the one set by `compile`, else greedy), a name ("greedy",
                "random", "top_k", "top_p", "beam") or a `Sampler`.
            stop_token_ids: "auto" (the tokenizer's end token), None (never stop
                early) or a list of ids. Each row stops at its first stop token,
                which is kept in the ids.
            min_new_tokens: int, stop tokens are banned until a row has this many
                new tokens.
            repetition_penalty: float > 0, Hugging Face's (CTRL) penalty on tokens
                already in the row: positive logits are divided by it, negative ones
                multiplied.
            no_repeat_ngram_size: int, if > 0 no n-gram of this size occurs twice in
                a row (prompt included).
            streamer: None or a callable, called after every step with the (B,)
                numpy array of the token each row just produced (-1 for a row that
                produced none: finished, or still inside its longer prompt). Not with
                beam search.
            return_dict: bool, return `{"outputs", "scores", "logits"}`: "scores" are
                beam search's (B, n) normalized scores (else None).
            output_logits: bool, with `return_dict`: "logits" holds, per row, the raw
                logits (N, V) of each of its N generated tokens (not with beam search).
                The loop then keeps a (B, L, V) buffer: mind large vocabularies.

        Returns:
            prompt + continuation for each prompt, in the form of `inputs` (for chat
            messages: the reply, a string per conversation); with a
            `BeamSampler(num_return_sequences=n > 1)`, n results per prompt.

        Example:
        >>> lm = GPTCausalLM.from_preset("gpt_tiny")
        >>> lm.generate("The teacher", max_new_tokens=20)
        >>> lm.generate([[1, 5, 9], [1, 7]], max_new_tokens=8, sampler="beam")
        >>> lm.generate([{"role": "user", "content": "Hello!"}])  # a preset with a chat template
        """
        chat = as_conversations(inputs)  # (single, conversations), or None for prompts and ids
        prompts = inputs if chat is None else self._chat_prompts(chat[1])
        outputs = samplers.generate(
            self, prompts, max_new_tokens=max_new_tokens, sampler=sampler, stop_token_ids=stop_token_ids,
            min_new_tokens=min_new_tokens, repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size, streamer=streamer, return_dict=return_dict,
            output_logits=output_logits,
        )
        if chat is None:
            return outputs
        replies = self._chat_replies(prompts, outputs["outputs"] if return_dict else outputs)
        replies = replies[0] if chat[0] else replies
        return {**outputs, "outputs": replies} if return_dict else replies

    def _chat_prompts(self, conversations):
        """Conversations -> prompt id lists: the template's text, tokenized with no special token added."""
        if self.preprocessor is None:
            raise ValueError(
                "Chat messages need a task with a preprocessor (its tokenizer holds the chat template); "
                "pass token ids instead."
            )
        tokenizer = self.preprocessor.tokenizer
        texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True)
        # The template writes the start token itself when the model wants one: the preprocessor's
        # own BOS would double it.
        return tokenizer.tokenize(texts)

    def _chat_replies(self, prompts, results):
        """Each result's new ids (prompt cut off) -> text; nested lists for several beams per prompt."""
        tokenizer = self.preprocessor.tokenizer
        replies = []
        for prompt, result in zip(prompts, results):
            if result and isinstance(result[0], list):  # num_return_sequences > 1
                replies.append([tokenizer.detokenize(row[len(prompt):]) for row in result])
            else:
                replies.append(tokenizer.detokenize(result[len(prompt):]))
        return replies
