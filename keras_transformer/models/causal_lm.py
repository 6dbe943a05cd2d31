"""CausalLM: the task base of decoder-only language models (next-token prediction)."""

import keras
from keras import ops

from keras_transformer import samplers
from keras_transformer.metrics import Perplexity
from keras_transformer.models.backbone import call_layer
from keras_transformer.models.task import Task, transposed_embedding
from keras_transformer.tokenizers.chat_template import as_conversations


class CausalLM(Task):
    """Next-token language model: logits (B, T, V) from token ids; loss ignores padding.

    Compiled by default with AdamW, masked sparse cross-entropy, token accuracy
    and perplexity. `generate` continues prompts with a KV-cached, compiled loop
    (see `keras_transformer.samplers`).
    """

    default_learning_rate = 1e-3

    def __init__(self, backbone, preprocessor=None, **kwargs):
        """`backbone`: a decoder-only backbone whose `token_embedding` is a `ReversibleEmbedding`
        (its reverse is the head); `preprocessor`: the family's preprocessor or None (then inputs
        are id arrays). Subclasses name their `backbone_cls` and `preprocessor_cls`."""
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        if preprocessor is not None and preprocessor.sequence_length > backbone.max_sequence_length:
            raise ValueError(
                f"The preprocessor's sequence_length={preprocessor.sequence_length} is longer than the "
                f"backbone's max_sequence_length={backbone.max_sequence_length}."
            )

        # === Functional model ===
        inputs = backbone.input
        hidden = backbone(inputs)  # (B, T, D)
        logits = backbone.token_embedding(hidden, reverse=True)  # (B, T, D) -> (B, T, V)
        super().__init__(inputs=inputs, outputs=ops.cast(logits, "float32"), **kwargs)

    # --- decoding ---------------------------------------------------------

    def decode_head(self):
        """The head as a (D, V) array in the compute dtype, made once per decoding loop (see `Task.decode_head`):
        the transposed token embedding when the backbone ties them, else the separate reverse matrix."""
        embedding = self.backbone.token_embedding
        if embedding.tie_weights:
            return transposed_embedding(self.backbone)  # (V, D) -> (D, V)
        return ops.cast(embedding.reverse_embeddings, self.backbone.compute_dtype)  # (D, V)

    def compute_logits(self, hidden, head=None, call_layer=call_layer):
        """Hidden states (B, T, D) -> logits (B, T, V); `head`: None or `decode_head()`."""
        if head is not None:
            return ops.matmul(hidden, head)  # (B, T, D) x (D, V) -> (B, T, V)
        return call_layer(self.backbone.token_embedding, hidden, reverse=True)  # (B, T, D) -> (B, T, V)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, head=None, call_layer=call_layer):
        """Logits (B, T, V) float32 for T new tokens and the updated cache (see the backbone's `call_with_cache`).

        `head`: None, or `decode_head()` (the same projection as a (D, V) array made once per loop).
        `call_layer`: how the layers are called (see `backbone.call_layer`).
        """
        hidden, cache = self.backbone.call_with_cache(token_ids, cache, cache_index, padding_mask, call_layer)
        return ops.cast(self.compute_logits(hidden, head, call_layer), "float32"), cache

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
