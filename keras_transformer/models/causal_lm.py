"""CausalLM: the task base of decoder-only language models (next-token prediction)."""

import keras
import numpy as np
from keras import ops

from keras_transformer.decoding import GenerateOptions
from keras_transformer.metrics import Perplexity
from keras_transformer.models.backbone import call_layer
from keras_transformer.models.constrained_generation import constrained_generate
from keras_transformer.models.language_model import LanguageModel
from keras_transformer.models.task import transposed_embedding
from keras_transformer.tokenizers.chat_template import as_conversations


class CausalLM(LanguageModel):
    """Next-token language model: logits (B, T, V) from token ids; loss ignores padding.

    Compiled by default with AdamW, masked sparse cross-entropy, token accuracy
    and perplexity. `generate` continues prompts with a KV-cached, compiled loop
    (see `keras_transformer.samplers`).
    """

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
        """Hidden states (B, T, D) -> logits (B, T, V); `head`: None or `decode_head()`. The embedding's
        `logit_soft_cap` (Gemma 2) applies either way."""
        if head is not None:
            logits = ops.matmul(hidden, head)  # (B, T, D) x (D, V) -> (B, T, V)
            cap = self.backbone.token_embedding.logit_soft_cap
            return logits if cap is None else ops.tanh(logits / cap) * cap
        return call_layer(self.backbone.token_embedding, hidden, reverse=True)  # (B, T, D) -> (B, T, V)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, head=None, call_layer=call_layer):
        """Logits (B, T, V) float32 for T new tokens and the updated cache (see the backbone's `call_with_cache`).

        `head`: None, or `decode_head()` (the same projection as a (D, V) array made once per loop).
        `call_layer`: how the layers are called (see `backbone.call_layer`).
        """
        hidden, cache = self.backbone.call_with_cache(token_ids, cache, cache_index, padding_mask, call_layer)
        return ops.cast(self.compute_logits(hidden, head, call_layer), "float32"), cache

    def generate_constrained(
        self, inputs, max_new_tokens=32, sampler=None, stop_token_ids="auto", json_schema=None, regex=None, grammar=None
    ):
        """Generate under a grammar: `json_schema` (a dict), `regex` or `grammar` (Lark or GBNF text), one of them.

        The grammar engine (llguidance) masks each step's logits, so the text parses unless it ran out of
        `max_new_tokens`; the end token is allowed exactly when the grammar accepts. This runs a host-stepped
        loop (eager cached steps, a prompt at a time; its cost against `generate`'s compiled loop is in
        benchmarks/RESULTS.md, "Constrained decoding"), with greedy or `RandomSampler(temperature, seed)`
        choices. Inputs and outputs as `generate`'s: strings (prompt + continuation) or id lists.

        Example:
        >>> from keras_transformer.models import GPTCausalLM
        >>> lm = GPTCausalLM.from_preset("gpt_stdlib")
        >>> import re
        >>> text = lm.generate_constrained("x = ", max_new_tokens=24, regex="[0-9]{1,3}( \\\\+ [0-9]{1,3})?")
        >>> bool(re.fullmatch("x = [0-9]{1,3}( \\\\+ [0-9]{1,3})?", text))
        True
        """
        constraints = {"json_schema": json_schema, "regex": regex, "grammar": grammar}
        return constrained_generate(self, inputs, max_new_tokens, sampler, stop_token_ids, constraints)

    def _generate_constrained(self, inputs, options, constraints, chat_template_kwargs=None):
        """`generate(..., json_schema= | regex= | grammar=)`: `generate_constrained` on the prompts (chat messages
        rendered by the template first, the replies returned); the options its loop lacks are refused by name."""
        defaults = GenerateOptions()
        lacking = [
            name
            for name in (
                "min_new_tokens",
                "repetition_penalty",
                "no_repeat_ngram_size",
                "streamer",
                "return_dict",
                "output_logits",
                "prompt_lookup_num_tokens",
                "max_matching_ngram_size",
                "draft_model",
                "num_draft_tokens",
            )
            if getattr(options, name) != getattr(defaults, name)
        ]
        if lacking:
            raise ValueError(
                "Constrained generation takes max_new_tokens, sampler and stop_token_ids only. Received: "
                + ", ".join(f"{name}={getattr(options, name)!r}" for name in lacking)
            )
        chat, prompts = self._prompts(inputs, chat_template_kwargs)
        args = (options.max_new_tokens, options.sampler, options.stop_token_ids, constraints)
        results = constrained_generate(self, prompts, *args)
        if chat is None:
            return results
        replies = self._chat_replies(prompts, results)
        return replies[0] if chat[0] else replies

    def score(self, token_ids, padding_mask=None, scoring_mode="logits", target_ids=None):
        """Score sequences with one forward pass (no cache), as keras-hub's `CausalLM.score`.

        Args:
            token_ids: int ids (B, T), or a string or a list of strings, tokenized as `generate` reads a
                prompt (the preprocessor's start token first, no end token) and right-padded.
            padding_mask: None (every position real) or (B, T) 0/1 or bool; strings bring their own.
            scoring_mode: "logits": the logits (B, T, V) float32 (position t scores the token after it);
                "loss": the per-token cross-entropy (B, T) of `target_ids` at each position, i.e. minus
                its log-probability (the log-softmax of the raw logits).
            target_ids: (B, T) ids, needed for "loss" with ids; with strings, None means the next
                token of each position (the last position and padding score 0).

        Returns:
            (B, T, V) logits or a (B, T) loss, float32 backend tensors.

        Example:
        >>> from keras_transformer.models import GPTCausalLM
        >>> lm = GPTCausalLM.from_preset("gpt_stdlib")
        >>> tuple(lm.score(["for i in range(", "import os"]).shape)  # (B, T, V): the start token counts
        (2, 6, 4096)
        """
        if scoring_mode not in ("logits", "loss"):
            raise ValueError(f"`scoring_mode` must be 'logits' or 'loss'. Received: scoring_mode={scoring_mode!r}")
        texts = [token_ids] if isinstance(token_ids, str) else token_ids
        is_text = isinstance(texts, (list, tuple)) and len(texts) > 0 and all(isinstance(t, str) for t in texts)
        next_token_mask = None
        if is_text:
            if padding_mask is not None or self.preprocessor is None:
                raise ValueError(
                    "Strings bring their own padding mask and need a task with a preprocessor. Received: "
                    f"padding_mask={'None' if padding_mask is None else 'an array'}, "
                    f"preprocessor={type(self.preprocessor).__name__}"
                )
            rows = self.preprocessor.generate_preprocess(list(texts))
            token_ids = np.zeros((len(rows), max(len(r) for r in rows)), "int32")  # (B, T), right-padded
            padding_mask = np.zeros(token_ids.shape, "int32")
            for b, row in enumerate(rows):
                token_ids[b, : len(row)], padding_mask[b, : len(row)] = row, 1
            if scoring_mode == "loss" and target_ids is None:
                target_ids = np.pad(token_ids[:, 1:], ((0, 0), (0, 1)))  # (B, T): the next token
                next_token_mask = np.pad(padding_mask[:, 1:], ((0, 0), (0, 1)))
        if scoring_mode == "loss" and target_ids is None:
            raise ValueError("`scoring_mode='loss'` with token ids needs `target_ids`. Received: target_ids=None")
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        if len(token_ids.shape) != 2 or token_ids.shape[1] > self.backbone.max_sequence_length:
            raise ValueError(
                f"`token_ids` must be (B, T) with T <= max_sequence_length={self.backbone.max_sequence_length}. "
                f"Received: shape={tuple(token_ids.shape)}"
            )
        padding_mask = ops.ones_like(token_ids) if padding_mask is None else padding_mask
        logits = self({"token_ids": token_ids, "padding_mask": ops.cast(padding_mask, "bool")}, training=False)
        if scoring_mode == "logits":
            return logits  # (B, T, V)
        loss = keras.losses.sparse_categorical_crossentropy(target_ids, logits, from_logits=True)  # (B, T)
        return loss if next_token_mask is None else loss * ops.cast(next_token_mask, loss.dtype)

    def default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), Perplexity()]

    def _generate(self, inputs, options, chat_template_kwargs=None):
        """`generate` (see `LanguageModel.generate`), with chat messages rendered by the template."""
        chat, prompts = self._prompts(inputs, chat_template_kwargs)
        outputs = super()._generate(prompts, options)
        if chat is None:
            return outputs
        return_dict = options.return_dict
        replies = self._chat_replies(prompts, outputs["outputs"] if return_dict else outputs)
        replies = replies[0] if chat[0] else replies
        return {**outputs, "outputs": replies} if return_dict else replies

    def _prompts(self, inputs, chat_template_kwargs):
        """(chat, prompts): chat is (single, conversations) for chat messages, rendered to prompt ids by the
        template, else None with the inputs as they are."""
        chat = as_conversations(inputs)  # (single, conversations), or None for prompts and ids
        if chat is None and chat_template_kwargs is not None:
            raise ValueError(
                "`chat_template_kwargs` applies to chat messages; these inputs are prompts or token ids. Received: "
                f"chat_template_kwargs={chat_template_kwargs!r} with inputs of type {type(inputs).__name__}"
            )
        return chat, (inputs if chat is None else self._chat_prompts(chat[1], chat_template_kwargs or {}))

    def _chat_prompts(self, conversations, template_variables):
        """Conversations -> prompt id lists: the template's text (with `template_variables`, e.g.
        `enable_thinking`), tokenized with no special token added."""
        if self.preprocessor is None:
            raise ValueError(
                "Chat messages need a task with a preprocessor (its tokenizer holds the chat template); "
                "pass token ids instead."
            )
        tokenizer = self.preprocessor.tokenizer
        texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, **template_variables)
        # The template writes the start token itself when the model wants one: the preprocessor's
        # own BOS would double it.
        return tokenizer.tokenize(texts)

    def _chat_replies(self, prompts, results):
        """Each result's new ids (prompt cut off) -> text; nested lists for several beams per prompt."""
        tokenizer = self.preprocessor.tokenizer
        replies = []
        for prompt, result in zip(prompts, results):
            if result and isinstance(result[0], list):  # num_return_sequences > 1
                replies.append([tokenizer.detokenize(row[len(prompt) :]) for row in result])
            else:
                replies.append(tokenizer.detokenize(result[len(prompt) :]))
        return replies
