"""BERT (encoder) ONNX export on the current backend: the graph and the bundle's Encoder runner."""

import json
import os

import numpy as np
import onnxruntime
import pytest

from keras_transformer.bundle_runtime import load_bundle_runtime
from tests.export.helpers import BUNDLE_RUNTIME_FILES, to_numpy

pytestmark = pytest.mark.slow
ATOL = 1e-4


@pytest.fixture(scope="module")
def classifier(exported):
    return exported("bert")["task"]


@pytest.fixture(scope="module")
def bundle(exported):
    return exported("bert")["bundle"]


def _random_inputs(classifier, rng):
    batch, length = 3, 13  # shapes the export never saw
    return {
        "token_ids": rng.integers(0, classifier.backbone.vocabulary_size, (batch, length)),
        "segment_ids": rng.integers(0, 2, (batch, length)),
        "padding_mask": (np.arange(length)[None, :] < np.array([[13], [7], [2]])).astype(np.int64),
    }


def _keras_outputs(classifier, inputs):
    x = {k: v.astype(bool) if k == "padding_mask" else v.astype("int32") for k, v in inputs.items()}
    outputs = {k: to_numpy(v) for k, v in classifier.backbone(x).items()}
    outputs["logits"] = to_numpy(classifier(x))
    return outputs


def test_graph_matches_keras(bundle, classifier):
    assert sorted(os.listdir(bundle)) == sorted(
        [
            "bundle.json",
            "encoder.onnx",
            "preprocessor_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "weights.data",
            *BUNDLE_RUNTIME_FILES,
        ]
    )
    spec = json.loads((bundle / "bundle.json").read_text())
    assert spec["kind"] == "encoder" and spec["family"] == "bert"
    session = onnxruntime.InferenceSession(str(bundle / "encoder.onnx"))
    assert [i.name for i in session.get_inputs()] == ["token_ids", "segment_ids", "padding_mask"]
    inputs = _random_inputs(classifier, np.random.default_rng(1))
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, inputs)))
    expected = _keras_outputs(classifier, inputs)
    assert sorted(got) == sorted(expected) == ["logits", "pooled_output", "sequence_output"]
    real = inputs["padding_mask"].astype(bool)
    np.testing.assert_allclose(got["sequence_output"][real], expected["sequence_output"][real], atol=ATOL)
    np.testing.assert_allclose(got["pooled_output"], expected["pooled_output"], atol=ATOL)
    np.testing.assert_allclose(got["logits"], expected["logits"], atol=ATOL)


def test_encoder_runner_matches_keras_on_text(bundle, classifier):
    runtime = load_bundle_runtime(bundle)
    texts, pairs = ["the quick brown fox", "def add(a, b)"], ["jumps over", "return a + b"]
    got = runtime.Encoder(bundle)(texts, pairs)
    # Keras reads the preprocessor's packing (padded to its sequence length): same logits.
    x, _, _ = classifier.preprocessor((texts, pairs), predict=True)
    np.testing.assert_allclose(got["logits"], to_numpy(classifier(x)), atol=ATOL)
    with pytest.raises(ValueError, match="use `Encoder`"):
        runtime.Generator(bundle)
