"""The compiled training step on every family: 20 steps compiled and eager give the same training.

GPT is in test_compiled_fit.py (with inductor, checkpoint-resume, LoRA and dropout). Here each other
family's task (BERT masked LM and classifier, T5, Llama, the original Transformer) trains 20 steps of
`fit` with `sample_weight` and padded rows, once with Keras's eager step (`jit_compile=False`) and
once compiled (`jit_compile=True`): the per-step losses and the final weights must agree within
float32 tolerance, every step must have run through the compiled graph, and that graph must be one
Dynamo graph with no break. The graphs compile with `aot_eager` (AOTAutograd without code generation:
the whole graph is still traced with `fullgraph=True`, so a graph break still fails) because inductor
takes tens of seconds per model on a CPU; the inductor path is covered by test_compiled_fit.py.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.models.compiled_predict_step import CompiledPredictStep
from keras_transformer.models.compiled_test_step import CompiledTestStep
from keras_transformer.models.compiled_train_step import CompiledTrainStep
from tests.conftest import to_numpy
from tests.models.test_compiled_fit import _StepLosses

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "torch", reason="the compiled train step is PyTorch's (JAX jits, TensorFlow uses XLA)"
)

V, S, T, P, BATCH, STEPS = 48, 8, 6, 3, 4, 20  # vocabulary, source / target length, masked positions


def _lengths(rng, rows, length):
    lengths = rng.integers(2, length + 1, rows)
    lengths[0] = length  # one full row
    return np.arange(length)[None, :] < lengths[:, None]  # (B, L) bool


def _ids(rng, mask):
    return np.where(mask, rng.integers(1, V, mask.shape), 0).astype("int32")


def _bert(**kwargs):
    return kt.models.BertBackbone(
        vocabulary_size=V,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=S,
        dropout=0.0,
        **kwargs,
    )


def _bert_masked_lm(rng, rows):
    mask = _lengths(rng, rows, S)
    x = {
        "token_ids": _ids(rng, mask),
        "segment_ids": (np.arange(S)[None, :] >= S // 2).repeat(rows, 0).astype("int32"),
        "padding_mask": mask,
        "mask_positions": np.sort(rng.integers(0, 2, (rows, P)) + [0, 1, 2][:P], -1).astype("int32"),
    }
    y = rng.integers(1, V, (rows, P)).astype("int32")
    return kt.models.BertMaskedLM(_bert()), x, y, rng.uniform(0.0, 2.0, (rows, P)).astype("float32")


def _bert_classifier(rng, rows):
    mask = _lengths(rng, rows, S)
    x = {"token_ids": _ids(rng, mask), "segment_ids": np.zeros((rows, S), "int32"), "padding_mask": mask}
    y = rng.integers(0, 3, rows).astype("int32")
    return kt.models.BertClassifier(_bert(), 3, dropout=0.0), x, y, rng.uniform(0.0, 2.0, rows).astype("float32")


def _seq2seq(task, backbone):
    def build(rng, rows):
        encoder_mask, decoder_mask = _lengths(rng, rows, S), _lengths(rng, rows, T)
        x = {
            "encoder_token_ids": _ids(rng, encoder_mask),
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": _ids(rng, decoder_mask),
            "decoder_padding_mask": decoder_mask,
        }
        y = _ids(rng, decoder_mask)
        return task(backbone()), x, y, rng.uniform(0.0, 2.0, (rows, T)).astype("float32") * decoder_mask

    return build


def _llama(rng, rows):
    mask = _lengths(rng, rows, S)
    backbone = kt.models.LlamaBackbone(
        vocabulary_size=V,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        max_sequence_length=S,
    )
    y = _ids(rng, mask)
    return (
        kt.models.LlamaCausalLM(backbone),
        {"token_ids": _ids(rng, mask), "padding_mask": mask},
        y,
        (rng.uniform(0.0, 2.0, (rows, S)).astype("float32") * mask),
    )


FAMILIES = {
    "bert_masked_lm": _bert_masked_lm,
    "bert_classifier": _bert_classifier,
    "t5": _seq2seq(
        kt.models.T5Seq2SeqLM,
        lambda: kt.models.T5Backbone(
            vocabulary_size=V,
            num_layers=1,
            num_decoder_layers=2,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=32,
            key_dim=8,
            dropout=0.0,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=10,
            activation="gated-gelu",
        ),
    ),
    "llama": _llama,
    "transformer": _seq2seq(
        kt.models.TransformerSeq2SeqLM,
        lambda: kt.models.TransformerBackbone(
            vocabulary_size=V,
            num_layers=1,
            num_decoder_layers=2,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=32,
            max_sequence_length=S,
            dropout=0.0,
        ),
    ),
}


def _train(family, jit_compile):
    keras.utils.set_random_seed(0)
    task, x, y, w = FAMILIES[family](np.random.default_rng(0), STEPS * BATCH)
    task.compile(jit_compile=jit_compile)
    recorder = _StepLosses()
    history = task.fit(
        x, y, sample_weight=w, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[recorder]
    )
    return task, recorder.losses, history.history, (x, y, w)


def _dynamo_counts():
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_fit_matches_eager_fit(family, monkeypatch):
    eager, eager_losses, eager_history, _ = _train(family, jit_compile=False)
    assert not isinstance(eager.train_function, CompiledTrainStep)
    monkeypatch.setenv("KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND", "aot_eager")
    graphs, breaks = _dynamo_counts()
    task, losses, history, _ = _train(family, jit_compile=True)
    # One graph for the 20 steps: Dynamo compiled one (a break or a recompile would make more) and
    # broke nowhere (fullgraph=True would also raise on a break).
    assert _dynamo_counts() == (graphs + 1, breaks)
    step = task.train_function
    # The compiled graph ran every step: Keras's eager train_step (eager_steps) never did.
    assert (step.compiled_steps, step.eager_steps) == (STEPS, 0), step._eager_reason
    assert len(losses) == STEPS and not np.allclose(losses[0], losses[-1])  # it trained
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    assert sorted(history) == sorted(eager_history)  # the same metrics reported
    for name in history:
        np.testing.assert_allclose(history[name], eager_history[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for variable, expected in zip(task.weights, eager.weights, strict=True):
        np.testing.assert_allclose(to_numpy(variable), to_numpy(expected), rtol=1e-4, atol=1e-5, err_msg=variable.path)
    assert len(step.graphs) == 1


@pytest.mark.parametrize("family", ["bert_classifier", "llama"])  # `metrics`; `weighted_metrics`
def test_compiled_evaluate_and_predict_match_eager(family, monkeypatch):
    """`evaluate` (loss and metrics with and without sample_weight, over several batches) and `predict`
    run through their own compiled graphs and give Keras's eager results. The forward pass of every
    family is already in its training graph above; these two steps are the same for every family."""
    monkeypatch.setenv("KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND", "aot_eager")
    results = []
    for jit_compile in (False, True):
        keras.utils.set_random_seed(0)
        task, x, y, w = FAMILIES[family](np.random.default_rng(1), 3 * BATCH)
        task.compile(jit_compile=jit_compile)
        scores = task.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0, return_dict=True)
        unweighted = task.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)  # metrics reset between
        predictions = to_numpy(task.predict(x, batch_size=BATCH, verbose=0))
        results.append((scores, unweighted, predictions, task))
    (eager_scores, eager_unweighted, eager_predictions, eager), (scores, unweighted, predictions, task) = results
    assert not isinstance(eager.test_function, CompiledTestStep)
    assert not isinstance(eager.predict_function, CompiledPredictStep)
    # Every batch compiled: evaluate's with and without sample_weight are two graphs, predict's one.
    test, predict = task.test_function, task.predict_function
    assert (test.compiled_steps, test.eager_steps, len(test.graphs)) == (6, 0, 2), test._eager_reason
    assert (predict.compiled_steps, predict.eager_steps, len(predict.graphs)) == (3, 0, 1), predict._eager_reason
    assert sorted(scores) == sorted(eager_scores) and "loss" in scores
    assert scores != unweighted  # sample_weight mattered
    for name in scores:
        np.testing.assert_allclose(scores[name], eager_scores[name], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(unweighted[name], eager_unweighted[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(predictions, eager_predictions, rtol=1e-5, atol=1e-5)
