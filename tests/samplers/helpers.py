"""Helpers for the generation tests: a bigram LM with constructed logits, tiny random models
whose logits are spread out (no near-ties), and plain-numpy references."""

import types

import keras
import numpy as np
from keras import ops

from keras_transformer import decoding
from tests.conftest import to_numpy
from tests.layers.helpers import randomize_weights


class BigramLM:
    """A stand-in task: the logits of the next token are `table[previous token]` (V, V).

    It has the causal-LM decoding interface (`call_with_cache`, `backbone.cache_shape`), so the
    real compiled loop runs on it, and every step's logits are known exactly in numpy.
    """

    preprocessor = None
    compute_dtype = "float32"
    trainable_variables = []
    non_trainable_variables = []

    def __init__(self, table, max_sequence_length=64, preprocessor=None):
        self.table = np.asarray(table, "float32")
        self.preprocessor = preprocessor
        self.backbone = types.SimpleNamespace(
            vocabulary_size=self.table.shape[0],
            max_sequence_length=max_sequence_length,
            # (B, L, 2, Hkv, S, Dh) as a backbone's, with one layer and one head of size 1
            cache_shape=lambda batch_size, max_length: (batch_size, 1, 2, 1, max_length, 1),
        )

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None):
        return ops.take(ops.convert_to_tensor(self.table), token_ids, axis=0), cache  # (R, T) -> (R, T, V)

    def generate(self, inputs, **kwargs):
        return decoding.generate(self, inputs, **kwargs)


def bigram_greedy(
    table, prompt, max_new_tokens, stop_token_ids=(), min_new_tokens=0, repetition_penalty=1.0, no_repeat_ngram_size=0
):
    """Numpy greedy decoding of a bigram table with Hugging Face's processors, from their definitions."""
    sequence = list(prompt)
    for step in range(max_new_tokens):
        scores = table[sequence[-1]].astype(np.float64).copy()
        if repetition_penalty != 1.0:
            for token in set(sequence):
                scores[token] = (
                    scores[token] * repetition_penalty if scores[token] < 0 else scores[token] / repetition_penalty
                )
        n = no_repeat_ngram_size
        if n:
            prefix = sequence[len(sequence) - n + 1 :] if n > 1 else []
            for j in range(len(sequence) - n + 1):
                if sequence[j : j + n - 1] == prefix:
                    scores[sequence[j + n - 1]] = -np.inf
        if step < min_new_tokens:
            scores[list(stop_token_ids)] = -np.inf
        token = int(np.argmax(scores))
        sequence.append(token)
        if token in stop_token_ids:
            break
    return sequence


def tiny_gpt(vocabulary_size=8, max_sequence_length=64, seed=0):
    """A 2-layer, width-16 GPT with weights of std 0.5, so its logits have no near-ties."""
    from keras_transformer.models import GPTBackbone, GPTCausalLM

    backbone = GPTBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=max_sequence_length,
    )
    lm = GPTCausalLM(backbone)
    randomize_weights(lm, np.random.default_rng(seed), std=0.5)
    return lm


# Full forward passes run on fixed (ROWS, width) batches, so JAX and TensorFlow compile them once.
ROWS = 64


def _batched_forward(lm, inputs_fn, count):
    logits = []
    for begin in range(0, count, ROWS):
        rows = list(range(begin, min(begin + ROWS, count)))
        logits.append(to_numpy(lm.predict_on_batch(inputs_fn(rows))).astype(np.float64)[: len(rows)])
    return np.concatenate(logits)


def _pad(sequences, rows, width):
    ids = np.zeros((ROWS, width), "int32")
    mask = np.zeros((ROWS, width), bool)
    for row, index in enumerate(rows):
        ids[row, : len(sequences[index])] = sequences[index]
        mask[row, : len(sequences[index])] = True
    mask[len(rows) :, 0] = True  # filler rows: one visible token
    return ids, mask


def causal_logits(lm, sequences):
    """Full forward passes over unpadded sequences -> list of logits (T, V); row t predicts token t + 1."""
    width = lm.backbone.max_sequence_length

    def inputs(rows):
        ids, mask = _pad(sequences, rows, width)
        return {"token_ids": ids, "padding_mask": mask}

    logits = _batched_forward(lm, inputs, len(sequences))
    return [logits[i, : len(s)] for i, s in enumerate(sequences)]


def seq2seq_logits(lm, sources, decoder_sequences, width=16):
    """Full encoder-decoder passes -> list of decoder logits (T, V); row t predicts decoder token t + 1."""

    def inputs(rows):
        encoder_ids, encoder_mask = _pad(sources, rows, width)
        decoder_ids, decoder_mask = _pad(decoder_sequences, rows, width)
        return {
            "encoder_token_ids": encoder_ids,
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": decoder_ids,
            "decoder_padding_mask": decoder_mask,
        }

    logits = _batched_forward(lm, inputs, len(sources))
    return [logits[i, : len(s)] for i, s in enumerate(decoder_sequences)]


def prefix_log_probs(logits_fn, vocabulary_size, steps=3):
    """{prefix (tuple of up to steps - 1 tokens): next-token log-probs (V,)}, from one batch of full passes.

    `logits_fn(continuations)` -> list of logits (T_i, V) for prompt + continuation (the rows
    predicting the continuation's tokens are the last len(continuation) + 1 rows).
    """
    import itertools

    continuations = [list(c) for c in itertools.product(range(vocabulary_size), repeat=steps - 1)]
    table = {}
    for continuation, logits in zip(continuations, logits_fn(continuations)):
        rows = log_softmax(logits[-steps:])  # predictions of continuation tokens 0 .. steps - 1
        for k in range(steps):
            table[tuple(continuation[:k])] = rows[k]
    return table


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def exhaustive_beam(table, vocabulary_size, stop_token_id, length_penalty, steps=3):
    """Every continuation of up to `steps` tokens (ending at the stop token or at `steps`), scored
    sum(log p) / length**length_penalty, best first. `table` from `prefix_log_probs`."""
    found = []

    def extend(prefix, total):
        log_probs = table[tuple(prefix)]
        for token in range(vocabulary_size):
            sequence, score = prefix + [token], total + log_probs[token]
            if token == stop_token_id or len(sequence) == steps:
                found.append((score / len(sequence) ** length_penalty, sequence))
            else:
                extend(sequence, score)

    extend([], 0.0)
    return sorted(found, key=lambda item: -item[0])


def compiled_functions(task):
    """The compiled generation functions cached on a task (for retrace counting)."""
    cache = task.__dict__.get("_compiled_decoding")
    return dict(cache.functions) if cache is not None else {}


def is_eager_backend():
    return keras.config.backend() == "torch"
