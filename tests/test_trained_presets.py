"""The presets that ship trained weights: loaded by name, they re-measure on this backend the held-out
metrics their model cards report (read from metrics.json), and beat the same architecture left at random init.

The held-out data comes from the recipe's own functions (tools/train_presets.py); its sha256 must match the
one recorded at training time, so "other data" (e.g. another Python's standard library) is told apart from
"other weights". The metrics are computed here in numpy from the logits, not with the Keras metrics the
recipe used.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.models.quantization import quantization_mode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
try:
    import train_presets as recipes
finally:
    sys.path.pop(0)

TRAINED = {
    "gpt_stdlib": "perplexity",
    "llama_stdlib": "perplexity",
    "llama_stdlib_draft": "perplexity",
    "moe_stdlib": "perplexity",
    "bert_stdlib": "accuracy",
    "t5_reverse": "exact_match",
}


def _record(name):
    return json.loads((presets.resolve(name) / "metrics.json").read_text())


def _log_softmax(logits):
    logits = logits.astype("float64")
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _next_token_counts(lm, inputs, labels, batch_size=64):
    """(summed negative log-likelihood, correct predictions) over every label of the windows."""
    nll, correct = 0.0, 0
    for start in range(0, len(inputs), batch_size):
        ids = inputs[start : start + batch_size]
        logits = np.asarray(lm.predict_on_batch({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}))
        target = labels[start : start + batch_size]
        nll -= np.take_along_axis(_log_softmax(logits), target[..., None], axis=-1).sum()
        correct += int((logits.argmax(-1) == target).sum())
    return nll, correct


def _masked_correct(lm, inputs, labels, weights):
    return _masked_counts(lm, inputs, labels, weights)[1]


def _masked_counts(lm, inputs, labels, weights):
    """(summed negative log-likelihood, correct predictions) over the masked positions (weight 1)."""
    logits = np.asarray(lm.predict_on_batch(inputs))  # (B, P, V)
    nll = -(np.take_along_axis(_log_softmax(logits), labels[..., None], axis=-1)[..., 0] * weights).sum()
    return nll, int(((logits.argmax(-1) == labels) * weights).sum())


def test_trained_presets_are_registered_with_weights_and_cards():
    rows = {row["name"]: row for row in kt.list_presets()}
    for name, metric in TRAINED.items():
        assert rows[name]["trained"] and rows[name]["description"]
        record = _record(name)
        card = (presets.resolve(name) / "README.md").read_text()
        assert f"| {metric} | {record['metrics'][metric]:.4f} |" in card  # the card shows what metrics.json holds
        if name in recipes.QUANTIZED:
            for mode in recipes.QUANTIZATION_MODES:
                assert f"| {record['quantized'][mode]['perplexity']:.4f} (" in card
        size = sum(f.stat().st_size for f in presets.resolve(name).iterdir())
        assert size < 6.5e6, f"{name} is {size / 1e6:.1f} MB"


@pytest.mark.parametrize("name", ["gpt_stdlib", "llama_stdlib", "llama_stdlib_draft", "moe_stdlib"])
def test_causal_lm_held_out_perplexity_matches_its_card(name):
    record = _record(name)
    lm = kt.models.CausalLM.from_preset(name)
    inputs, labels = recipes.gpt_eval_data(lm.preprocessor.tokenizer)
    assert recipes.fingerprint(inputs, labels) == record["eval_data_sha256"]
    nll, correct = _next_token_counts(lm, inputs, labels)
    assert np.exp(nll / labels.size) == pytest.approx(record["metrics"]["perplexity"], rel=2e-3)
    assert abs(correct - record["metrics"]["accuracy"] * labels.size) <= 2  # argmax near-ties may differ by backend

    untrained = kt.models.CausalLM.from_preset(name, load_weights=False)
    nll_random, _ = _next_token_counts(untrained, inputs[:64], labels[:64])
    assert np.exp(nll / labels.size) < np.exp(nll_random / labels[:64].size) / 20


def test_the_draft_preset_shares_llama_stdlibs_tokenizer_and_is_smaller():
    """llama_stdlib_draft drafts for llama_stdlib (speculative decoding): one vocabulary, the same ids for a text,
    a third of the parameters, a worse perplexity than its target's."""
    target, draft = (kt.models.CausalLM.from_preset(name) for name in ("llama_stdlib", "llama_stdlib_draft"))
    assert (
        target.preprocessor.tokenizer.backend_tokenizer.to_str()
        == draft.preprocessor.tokenizer.backend_tokenizer.to_str()
    )
    assert target.backbone.vocabulary_size == draft.backbone.vocabulary_size
    assert draft.count_params() * 2.5 < target.count_params()
    assert _record("llama_stdlib_draft")["metrics"]["perplexity"] > _record("llama_stdlib")["metrics"]["perplexity"]


def test_moe_stdlib_is_a_sparse_llama_stdlib_whose_experts_all_work():
    """moe_stdlib: llama_stdlib's tokenizer and active feed-forward width (2 of 4 experts of half its width), within
    2% of its held-out perplexity, no expert left unused in training (its card's load, from `ExpertLoad`)."""
    moe, dense = (kt.models.CausalLM.from_preset(name) for name in ("moe_stdlib", "llama_stdlib"))
    options = moe.backbone.get_config()["mixture_of_experts"]
    assert options["top_k"] * options["intermediate_dim"] == dense.backbone.get_config()["intermediate_dim"]
    assert (
        moe.preprocessor.tokenizer.backend_tokenizer.to_str() == dense.preprocessor.tokenizer.backend_tokenizer.to_str()
    )
    record, baseline = _record("moe_stdlib"), _record("llama_stdlib")
    assert record["metrics"]["perplexity"] < baseline["metrics"]["perplexity"] * 1.02
    load = record["expert_load"]
    assert 0.1 < load["expert_load_min"] <= 1 / options["num_experts"] <= load["expert_load_max"] < 0.5


def test_llama_stdlib_beats_gpt_stdlib_on_the_same_held_out_data():
    """The README's comparison: equal parameters (within 0.1%), training steps and data."""
    gpt, llama = _record("gpt_stdlib"), _record("llama_stdlib")
    assert gpt["eval_data_sha256"] == llama["eval_data_sha256"]
    assert abs(gpt["parameter_count"] - llama["parameter_count"]) < 1e-3 * gpt["parameter_count"]
    assert llama["metrics"]["perplexity"] < gpt["metrics"]["perplexity"]


@pytest.mark.parametrize("mode", recipes.QUANTIZATION_MODES)
@pytest.mark.parametrize("name", recipes.QUANTIZED)
def test_quantized_held_out_metrics_match_the_card(name, mode):
    """The metrics after Keras's `task.quantize(mode)`, re-measured on this backend on the first windows (chunks) of
    the card's held-out data (metrics.json records them beside the card's full-set figures, to keep this test short);
    the quantized activations round differently by backend, hence looser tolerances than the float32 metrics'."""
    rows = recipes.QUANTIZED_CHECK_ROWS
    expected = _record(name)["quantized"][mode][f"first_{rows}"]
    lm, data = recipes.quantized_task(name, mode)
    assert quantization_mode(lm) == mode
    data = recipes.first_rows(data, rows)
    if name == "bert_stdlib":
        nll, correct = _masked_counts(lm, *data)
        count = data[2].sum()
    else:
        nll, correct = _next_token_counts(lm, *data)
        count = data[1].size
    assert np.exp(nll / count) == pytest.approx(expected["perplexity"], rel=5e-3)
    assert abs(correct - expected["accuracy"] * count) <= max(2, 1e-3 * count)


def test_bert_stdlib_held_out_masked_accuracy_matches_its_card():
    record = _record("bert_stdlib")
    lm = kt.models.BertMaskedLM.from_preset("bert_stdlib")
    inputs, labels, weights = recipes.bert_eval_data(lm.preprocessor.tokenizer)
    assert recipes.fingerprint(inputs["token_ids"], labels, weights) == record["eval_data_sha256"]
    correct = _masked_correct(lm, inputs, labels, weights)
    assert abs(correct - record["metrics"]["accuracy"] * weights.sum()) <= 1

    untrained = kt.models.BertMaskedLM.from_preset("bert_stdlib", load_weights=False)
    assert _masked_correct(untrained, inputs, labels, weights) < correct / 10


def test_t5_reverse_held_out_exact_match_matches_its_card():
    record = _record("t5_reverse")
    lm = kt.models.T5Seq2SeqLM.from_preset("t5_reverse")
    sources, targets = recipes.t5_eval_data()
    assert recipes.fingerprint(np.array(sources + targets)) == record["eval_data_sha256"]
    outputs = lm.generate(sources, max_new_tokens=recipes.T5_LENGTHS[1] + 1, sampler="greedy")
    correct = sum(o == t for o, t in zip(outputs, targets))
    assert abs(correct - record["metrics"]["exact_match"] * len(sources)) <= 1
    assert correct >= 0.99 * len(sources)

    untrained = kt.models.T5Seq2SeqLM.from_preset("t5_reverse", load_weights=False)
    outputs = untrained.generate(sources[:50], max_new_tokens=recipes.T5_LENGTHS[1] + 1, sampler="greedy")
    assert sum(o == t for o, t in zip(outputs, targets)) <= 2
