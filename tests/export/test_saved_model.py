"""SavedModels of every family, exported from the current backend and loaded by TensorFlow alone.

One child process (which never imports keras_transformer) loads the four SavedModels and runs
their signatures; each test compares one family's results with the Keras model here.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer.models import T5Backbone, T5Seq2SeqLM
from keras_transformer.samplers import RandomSampler

from tests.export.helpers import causal_next_logits, reference_greedy, seq2seq_next_logits, to_numpy

pytestmark = pytest.mark.slow
ATOL = 1e-4
NEW_TOKENS = 8
LONG = 140  # new tokens of a T5 call past the first cache chunk (128 positions)
SOURCES = ["translate english to german: the house", "the lazy dog", "def add(a, b):"]

LOAD_SAVED_MODELS = """
import json, sys
import numpy as np
import tensorflow as tf

spec = json.load(open(sys.argv[1]))
results = {}

def generate(model, ids, mask, temperature=0.0, top_k=0, seed=0, new=%(new)d, min_new=0, penalty=1.0):
    ids, mask = np.array(ids, np.int32), np.array(mask, bool)
    inputs = model.signatures["generate"].structured_input_signature[1]
    names = ("token_ids", "padding_mask") if "token_ids" in inputs else ("encoder_token_ids", "encoder_padding_mask")
    out = model.signatures["generate"](**{names[0]: ids, names[1]: mask}, max_new_tokens=tf.constant(new),
        temperature=tf.constant(float(temperature)), top_k=tf.constant(top_k), top_p=tf.constant(1.0),
        seed=tf.constant(seed), min_new_tokens=tf.constant(min_new), repetition_penalty=tf.constant(float(penalty)))
    return {"ids": out["token_ids"].numpy().tolist(), "mask": out["padding_mask"].numpy().tolist()}

gpt = tf.saved_model.load(spec["gpt"]["path"])
ids, mask = spec["gpt"]["ids"], spec["gpt"]["mask"]
results["gpt"] = {
    "greedy": generate(gpt, ids, mask),
    "sampled": [generate(gpt, ids, mask, 3.0, 0, seed)["ids"] for seed in (1, 1, 2)],
    "top1": generate(gpt, ids, mask, 1.0, 1, 3)["ids"],
    "processors": generate(gpt, ids, mask, new=12, min_new=6, penalty=1.8),
    "logits": gpt.signatures["serving_default"](token_ids=np.array(ids, np.int32),
                                                padding_mask=np.array(mask, bool))["logits"].numpy().tolist(),
    "signatures": sorted(gpt.signatures),
}
bert = tf.saved_model.load(spec["bert"]["path"])
inputs = {k: np.array(v, bool if k == "padding_mask" else np.int32) for k, v in spec["bert"]["inputs"].items()}
results["bert"] = {k: v.numpy().tolist() for k, v in bert.signatures["serving_default"](**inputs).items()}
results["bert"]["signatures"] = sorted(bert.signatures)
for name in ("t5", "transformer"):
    model = tf.saved_model.load(spec[name]["path"])
    greedy = generate(model, spec[name]["ids"], spec[name]["mask"])
    results[name] = {"greedy": greedy, "signatures": sorted(model.signatures)}
# Past the first 128 positions: the graph's max_length loop (its cache widened step by step).
results["t5"]["long"] = generate(tf.saved_model.load(spec["t5"]["path"]), spec["t5"]["ids"], spec["t5"]["mask"],
                                 1.0, 0, 5, new=%(long)d, min_new=%(long)d - 5)
try:
    generate(gpt, ids, mask, new=spec["gpt"]["max_length"])
    results["too_long"] = None
except tf.errors.InvalidArgumentError as error:
    results["too_long"] = error.message
results["keras_transformer_imported"] = "keras_transformer" in sys.modules
json.dump(results, open(sys.argv[2], "w"))
print(json.dumps({"ok": True}))
""" % {"new": NEW_TOKENS, "long": LONG}


def _gpt_prompts(lm):
    tokenizer = lm.preprocessor.tokenizer
    prompts = [[tokenizer.bos_token_id] + tokenizer.tokenize(t) for t in ["def add(a", "for", "the quick brown"]]
    width = max(len(p) for p in prompts)
    ids = np.array([p + [0] * (width - len(p)) for p in prompts])
    mask = np.array([[1] * len(p) + [0] * (width - len(p)) for p in prompts], bool)
    return prompts, ids, mask


def _bert_inputs(classifier):
    rng = np.random.default_rng(2)
    batch, length = 3, 13
    return {
        "token_ids": rng.integers(0, classifier.backbone.vocabulary_size, (batch, length)),
        "segment_ids": rng.integers(0, 2, (batch, length)),
        "padding_mask": (np.arange(length)[None, :] < np.array([[13], [7], [2]])),
    }


def saved_model_job(exported, directory):
    """(script, its arguments): every family's SavedModel run by a TensorFlow-only process (conftest.py's
    `saved_model_runs` runs it, in the same child as test_runtime_parity.py's)."""
    spec = {}
    _, ids, mask = _gpt_prompts(exported("gpt")["task"])
    spec["gpt"] = {
        "path": str(exported("gpt")["saved_model"]),
        "ids": ids.tolist(),
        "mask": mask.tolist(),
        "max_length": exported("gpt")["task"].backbone.max_sequence_length,
    }
    inputs = _bert_inputs(exported("bert")["task"])
    spec["bert"] = {"path": str(exported("bert")["saved_model"]), "inputs": {k: v.tolist() for k, v in inputs.items()}}
    for name in ("t5", "transformer"):
        ids, mask = exported(name)["task"].preprocessor.generate_preprocess(SOURCES)
        spec[name] = {"path": str(exported(name)["saved_model"]), "ids": ids.tolist(), "mask": mask.tolist()}
    directory.mkdir(parents=True)
    (directory / "spec.json").write_text(json.dumps(spec))
    return LOAD_SAVED_MODELS, (directory / "spec.json", directory / "results.json")


@pytest.fixture(scope="module")
def loaded(saved_model_runs):
    """Every family's SavedModel run by a TensorFlow-only process: {family: results}."""
    result = saved_model_runs["saved_model"]
    assert result["printed"] == {"ok": True}
    return json.loads((result["directory"] / "results.json").read_text())


def test_loaded_without_keras_transformer(loaded):
    assert loaded["keras_transformer_imported"] is False
    assert loaded["gpt"]["signatures"] == ["forward", "generate", "generate_beam", "serving_default"]
    assert loaded["bert"]["signatures"] == ["forward", "serving_default"]
    assert loaded["t5"]["signatures"] == ["forward", "generate", "generate_beam", "serving_default"]


def test_gpt_generate_and_forward_match_keras(loaded, exported):
    lm = exported("gpt")["task"]
    prompts, ids, mask = _gpt_prompts(lm)
    result = loaded["gpt"]
    out_ids, out_mask = np.array(result["greedy"]["ids"]), np.array(result["greedy"]["mask"], bool)
    assert out_ids.shape == (3, ids.shape[1] + NEW_TOKENS)
    expected = lm.generate(prompts, max_new_tokens=NEW_TOKENS, sampler="greedy")
    eos = lm.preprocessor.tokenizer.eos_token_id
    for row, prompt in enumerate(prompts):
        assert out_ids[row][out_mask[row]].tolist() == expected[row]
        assert expected[row] == prompt + reference_greedy(causal_next_logits(lm), prompt, NEW_TOKENS, eos)
    # Sampling: the same seed gives the same tokens, another seed others; top_k=1 is greedy.
    assert result["sampled"][0] == result["sampled"][1] != result["sampled"][2]
    assert result["top1"] == result["greedy"]["ids"]
    logits = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": mask}))
    np.testing.assert_allclose(np.array(result["logits"])[mask], logits[mask], atol=ATOL)


def test_bert_forward_matches_keras(loaded, exported):
    classifier = exported("bert")["task"]
    inputs = _bert_inputs(classifier)
    x = {k: v if k == "padding_mask" else v.astype("int32") for k, v in inputs.items()}
    expected = {k: to_numpy(v) for k, v in classifier.backbone(x).items()}
    expected["logits"] = to_numpy(classifier(x))
    result = loaded["bert"]
    real = inputs["padding_mask"]
    np.testing.assert_allclose(np.array(result["sequence_output"])[real], expected["sequence_output"][real], atol=ATOL)
    for name in ("pooled_output", "logits"):
        np.testing.assert_allclose(np.array(result[name]), expected[name], atol=ATOL)


@pytest.mark.parametrize("name", ["t5", "transformer"])
def test_seq2seq_generate_matches_keras(loaded, exported, name):
    task = exported(name)["task"]
    ids, mask = task.preprocessor.generate_preprocess(SOURCES)
    sources = [row[m].tolist() for row, m in zip(ids, mask)]
    result = loaded[name]["greedy"]
    out_ids, out_mask = np.array(result["ids"]), np.array(result["mask"], bool)
    assert out_ids.shape == (len(SOURCES), NEW_TOKENS + 1)
    expected = task.generate(sources, max_new_tokens=NEW_TOKENS, sampler="greedy")  # start token + new tokens
    start, eos = task.preprocessor.decoder_start_token_id, task.preprocessor.tokenizer.eos_token_id
    for row, source in enumerate(sources):
        assert out_ids[row][out_mask[row]].tolist() == expected[row]
        assert expected[row] == [start] + reference_greedy(seq2seq_next_logits(task, source), [start], NEW_TOKENS, eos)


def test_gpt_processors_and_limits_match_keras(loaded, exported):
    """The repetition penalty and min_new_tokens inputs act as in Keras; a too long call is an error naming
    max_length."""
    lm = exported("gpt")["task"]
    prompts, _, _ = _gpt_prompts(lm)
    result = loaded["gpt"]["processors"]
    got = [np.array(row)[np.array(mask, bool)].tolist() for row, mask in zip(result["ids"], result["mask"])]
    expected = lm.generate(prompts, max_new_tokens=12, min_new_tokens=6, repetition_penalty=1.8)
    assert got == [list(map(int, row)) for row in expected]
    assert got != [list(map(int, row)) for row in lm.generate(prompts, max_new_tokens=12)]  # the processors act
    assert "max_length=48" in loaded["too_long"]


def test_t5_long_generation_matches_keras(loaded, exported):
    task = exported("t5")["task"]
    ids, mask = task.preprocessor.generate_preprocess(SOURCES)
    sources = [row[m].tolist() for row, m in zip(ids, mask)]
    result = loaded["t5"]["long"]
    got = [np.array(row)[np.array(m, bool)].tolist() for row, m in zip(result["ids"], result["mask"])]
    expected = task.generate(
        sources, max_new_tokens=LONG, min_new_tokens=LONG - 5, sampler=RandomSampler(temperature=1.0, seed=5)
    )
    assert got == [list(map(int, row)) for row in expected]
    assert max(len(row) for row in got) > 128


GRAPH_NODES = """
import sys
from tensorflow.core.protobuf import saved_model_pb2
for path in sys.argv[1:]:
    model = saved_model_pb2.SavedModel()
    model.ParseFromString(open(path, "rb").read())
    graph = model.meta_graphs[0].graph_def
    print(len(graph.node) + sum(len(function.node_def) for function in graph.library.function))
"""


def _t5_saved_model(tmp_path, encoder_layers):
    """The SavedModel of a tiny T5 with `encoder_layers` encoder blocks."""
    keras.utils.set_random_seed(0)
    backbone = T5Backbone(
        100,
        num_layers=encoder_layers,
        num_decoder_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        key_dim=8,
        dropout=0.0,
    )
    return T5Seq2SeqLM(backbone).export(tmp_path / f"t5_{encoder_layers}", format="tf_saved_model")


def test_seq2seq_encoder_blocks_are_written_once(tmp_path):
    """The `generate` signatures call the encoder's blocks through the shared layer functions, as `forward` and the
    decoder steps do: a block more adds a call and its weights' reads to each signature, not a copy of the block's
    computation to each (an encoder called layer by layer wrote every block into `generate` and `generate_beam`)."""
    paths = [_t5_saved_model(tmp_path, layers) / "saved_model.pb" for layers in (1, 4)]
    child = subprocess.run(  # the nodes of each SavedModel's graph and function library
        [sys.executable, "-c", GRAPH_NODES, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert child.returncode == 0, child.stderr[-2000:]
    one, four = map(int, child.stdout.split()[-2:])
    per_layer = (four - one) / 3
    assert per_layer < 100, per_layer  # the nodes one more encoder block adds to the SavedModel's graphs
