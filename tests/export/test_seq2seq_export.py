"""Encoder-decoder ONNX export (T5, Transformer) on the current backend: the graphs and bundle generation."""

import json
import os

import numpy as np
import onnx
import onnxruntime
import pytest

from keras_transformer.bundle_runtime import load_bundle_runtime
from keras_transformer.samplers import BeamSampler
from tests.export.helpers import BUNDLE_RUNTIME_FILES, reference_greedy, seq2seq_next_logits, to_numpy

pytestmark = pytest.mark.slow
ATOL = 1e-4
SOURCES = ["translate english to german: the house", "the lazy dog", "def add(a, b):"]


FAMILIES = ["t5", "transformer"]


def _run(session, feeds):
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _sources(task):
    """The source id lists the preprocessor makes (end token included, no padding)."""
    ids, mask = task.preprocessor.generate_preprocess(SOURCES)
    return [row[m].tolist() for row, m in zip(ids, mask)]


@pytest.mark.parametrize("name", FAMILIES)
def test_graphs_match_keras(exported, name):
    task, bundle = exported(name)["task"], exported(name)["bundle"]
    layers = task.backbone.cache_shape(1, 1)[1]
    assert sorted(os.listdir(bundle)) == sorted(
        [
            "bundle.json",
            "decoder.onnx",
            "encoder.onnx",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "weights.data",
            *BUNDLE_RUNTIME_FILES,
        ]
    )
    assert json.loads((bundle / "bundle.json").read_text())["kind"] == "encoder_decoder"
    # The decoder is the ONNX kernels' in-place step, not the traced fallback.
    decoder_model = onnx.load(bundle / "decoder.onnx")
    assert [value.name for value in decoder_model.graph.input][:3] == [
        "input_ids",
        "position_ids",
        "encoder_attention_mask",
    ]
    assert {"GroupQueryAttention", "MultiHeadAttention"} <= {node.op_type for node in decoder_model.graph.node}
    encoder = onnxruntime.InferenceSession(str(bundle / "encoder.onnx"))
    decoder = onnxruntime.InferenceSession(str(bundle / "decoder.onnx"))
    rng = np.random.default_rng(3)
    batch, source_length, vocabulary = 3, 9, task.backbone.vocabulary_size
    ids = rng.integers(0, vocabulary, (batch, source_length))
    mask = (np.arange(source_length)[None, :] < np.array([[9], [5], [2]])).astype(np.int64)
    encoded = _run(encoder, {"input_ids": ids, "attention_mask": mask})
    hidden = task.encode(ids.astype("int32"), mask.astype(bool))
    real = mask.astype(bool)
    np.testing.assert_allclose(encoded["encoder_hidden_states"][real], to_numpy(hidden)[real], atol=ATOL)
    cross = to_numpy(task.compute_cross_cache(hidden))
    np.testing.assert_allclose(
        encoded[f"cross_key_values.{layers - 1}.value"], cross[:, -1, 1], atol=ATOL
    )  # ONNX (B, Hkv, S_enc, Dh); Keras (B, L, 2, Hkv, S_enc, Dh)

    # Decode five random tokens from an empty cache (the growing form: pasts of exactly t positions);
    # each step's logits are the full forward pass's last.
    _, _, _, heads, _, head_dim = task.backbone.cache_shape(1, 1)
    past = {
        f"past_key_values.{i}.{p}": np.zeros((batch, heads, 0, head_dim), np.float32)
        for i in range(layers)
        for p in ("key", "value")
    }
    cross_feeds = {k: v for k, v in encoded.items() if k.startswith("cross_key_values")}
    targets = rng.integers(0, vocabulary, (batch, 5))
    expected = to_numpy(
        task(
            {
                "encoder_token_ids": ids.astype("int32"),
                "encoder_padding_mask": mask.astype(bool),
                "decoder_token_ids": targets.astype("int32"),
                "decoder_padding_mask": np.ones(targets.shape, bool),
            }
        )
    )
    for t in range(5):
        step = _run(
            decoder,
            {
                "input_ids": targets[:, t : t + 1],
                "position_ids": np.full((batch, 1), t, np.int64),
                "encoder_attention_mask": mask,
                **past,
                **cross_feeds,
            },
        )
        np.testing.assert_allclose(step["logits"][:, 0], expected[:, t], atol=ATOL)
        past = {f"past_key_values.{i}.{p}": step[f"present.{i}.{p}"] for i in range(layers) for p in ("key", "value")}


@pytest.mark.parametrize("name", FAMILIES)
def test_bundle_generation_matches_keras(exported, name):
    task, bundle = exported(name)["task"], exported(name)["bundle"]
    generator = load_bundle_runtime(bundle).Generator(bundle)
    assert generator._in_place  # caches bound once per generation and written in place
    sources = _sources(task)
    start = task.preprocessor.decoder_start_token_id
    eos = task.preprocessor.tokenizer.eos_token_id
    greedy = generator.generate_ids(sources, max_new_tokens=10)
    assert greedy == [reference_greedy(seq2seq_next_logits(task, s), [start], 10, eos) for s in sources]
    assert [[start] + g for g in greedy] == task.generate(sources, max_new_tokens=10, sampler="greedy")
    options = {"num_beams": 3, "length_penalty": 0.5, "early_stopping": True}
    beam = generator.generate_ids(sources, max_new_tokens=6, sampler="beam", **options)
    assert [[start] + b for b in beam] == task.generate(sources, max_new_tokens=6, sampler=BeamSampler(**options))
    # Beams of several inputs reordering their buffer rows for 10 steps: each row keeps its input's encoder.
    beam = generator.generate_ids(sources, max_new_tokens=10, sampler="beam", num_beams=4)
    assert [[start] + b for b in beam] == task.generate(sources, max_new_tokens=10, sampler=BeamSampler(num_beams=4))
    # Text in, text out: the new tokens up to the end token, detokenized. (Not compared with
    # `task.generate(strings)`: that cuts at the first end token counting the start token,
    # which is the end token for the Transformer's BPE tokenizer, so it returns "".)
    assert generator.generate(SOURCES, max_new_tokens=10) == task.preprocessor.generate_postprocess(greedy)
