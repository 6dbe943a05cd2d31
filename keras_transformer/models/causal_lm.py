"""CausalLM: the task base of decoder-only language models (next-token prediction)."""

import keras

from keras_transformer import samplers
from keras_transformer.metrics import Perplexity
from keras_transformer.models.task import Task


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
                the same container: arrays are right-padded with the pad id.
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
            prompt + continuation for each prompt, in the form of `inputs`; with a
            `BeamSampler(num_return_sequences=n > 1)`, n results per prompt.

        Example:
        >>> lm = GPTCausalLM.from_preset("gpt_tiny")
        >>> lm.generate("The teacher", max_new_tokens=20)
        >>> lm.generate([[1, 5, 9], [1, 7]], max_new_tokens=8, sampler="beam")
        """
        return samplers.generate(
            self, inputs, max_new_tokens=max_new_tokens, sampler=sampler, stop_token_ids=stop_token_ids,
            min_new_tokens=min_new_tokens, repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size, streamer=streamer, return_dict=return_dict,
            output_logits=output_logits,
        )
