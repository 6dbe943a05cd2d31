"""Mixed precision: a few `fit` steps and generation under mixed_float16 / mixed_bfloat16 stay finite.

For the GPT, BERT and T5 families, a tiny task is built under the global policy, trained for two
steps on a batch that holds a partly padded row and a fully padded row, then asked to generate. A
fully padded row is where a mask bias that overflows the compute dtype (-1e9 is -inf in float16)
turns the softmax into NaN. Every label counts in the loss (no sample weights), so a non-finite
logit in any row makes the loss of that step non-finite: the losses (forward passes before and
after an update), the updated weights and the generated logits must all be finite. The global
policy is restored after each test.

Axes: B batch, T length, V vocabulary.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from tests.conftest import to_numpy


V, B, T = 40, 3, 6
SMALL = dict(num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16, dropout=0.0)


# Every family and both policies run by default; the other three pairs (each a few seconds of
# compiling on TensorFlow and JAX) are marked slow.
CASES = [
    ("gpt", "mixed_float16"),
    ("bert", "mixed_bfloat16"),
    ("t5", "mixed_float16"),
    pytest.param("gpt", "mixed_bfloat16", marks=pytest.mark.slow),
    pytest.param("bert", "mixed_float16", marks=pytest.mark.slow),
    pytest.param("t5", "mixed_bfloat16", marks=pytest.mark.slow),
]


@pytest.fixture
def global_policy():
    """Set the global dtype policy for one test, and restore the previous one afterwards."""
    previous = keras.config.dtype_policy()
    try:
        yield keras.config.set_dtype_policy
    finally:
        keras.config.set_dtype_policy(previous)


def padding_mask():
    mask = np.ones((B, T), bool)  # (B, T)
    mask[1, 4:] = False  # a padded row
    mask[2, :] = False  # a fully padded row: every key masked
    return mask


def batch(family, rng):
    """(task, x, y) for a tiny task of `family`; row 2 is all padding."""
    ids = rng.integers(1, V, (B, T)).astype("int32")  # (B, T)
    mask = padding_mask()
    if family == "gpt":
        task = kt.models.GPTCausalLM(kt.models.GPTBackbone(vocabulary_size=V, **SMALL))
        return task, {"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1)
    if family == "bert":
        task = kt.models.BertMaskedLM(kt.models.BertBackbone(vocabulary_size=V, **SMALL))
        positions = np.tile(np.array([[1, 2]], "int32"), (B, 1))  # (B, P)
        x = {
            "token_ids": ids,
            "segment_ids": np.zeros((B, T), "int32"),
            "padding_mask": mask,
            "mask_positions": positions,
        }
        return task, x, ids[:, 1:3]
    task = kt.models.T5Seq2SeqLM(kt.models.T5Backbone(vocabulary_size=V, **SMALL))
    x = {
        "encoder_token_ids": ids,
        "encoder_padding_mask": mask,
        "decoder_token_ids": ids[:, ::-1].copy(),
        "decoder_padding_mask": mask.copy(),
    }
    return task, x, ids


@pytest.mark.parametrize("family, policy", CASES)
def test_fit_and_generate_stay_finite(family, policy, global_policy, rng):
    global_policy(policy)
    task, x, y = batch(family, rng)
    embedding = task.backbone.token_embedding
    assert embedding.compute_dtype == policy.removeprefix("mixed_")  # the policy took effect
    assert embedding.embeddings.dtype == "float32"  # variables stay float32

    task.compile(optimizer=keras.optimizers.Adam(1e-2))
    before = [to_numpy(w).copy() for w in task.trainable_weights]
    history = task.fit(x, y, batch_size=B, epochs=2, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    after = [to_numpy(w) for w in task.trainable_weights]
    assert all(np.all(np.isfinite(w)) for w in after)
    # The steps were taken (a loss-scaling optimizer skips steps whose gradients overflow).
    assert any(not np.array_equal(a, b) for a, b in zip(after, before))

    if family != "bert":
        prompts = x["token_ids"][:2, :3] if family == "gpt" else x["encoder_token_ids"][:2]
        result = task.generate(prompts, max_new_tokens=2, stop_token_ids=None, return_dict=True, output_logits=True)
        for row_logits, row_ids in zip(result["logits"], result["outputs"]):
            assert row_logits.shape == (2, V) and np.all(np.isfinite(row_logits))
            assert np.all((np.asarray(row_ids) >= 0) & (np.asarray(row_ids) < V))
