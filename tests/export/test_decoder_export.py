"""GPT (decoder-only) ONNX export on the current backend: the graphs and the bundle's runner.

The bundle is exported once per session (see conftest.py); the SavedModel is tested in
test_saved_model.py.
"""

import json
import os
import sys

import numpy as np
import onnxruntime
import pytest

from keras_transformer import cli
from keras_transformer.samplers import BeamSampler, RandomSampler
from tests.export.helpers import (
    FRAMEWORKS,
    causal_next_logits,
    reference_greedy,
    run_python,
    to_numpy,
)

pytestmark = pytest.mark.slow
ATOL = 1e-4


@pytest.fixture(scope="module")
def lm(exported):
    return exported("gpt")["task"]


@pytest.fixture(scope="module")
def bundle(exported):
    return exported("gpt")["bundle"]


@pytest.fixture(scope="module")
def generator(bundle):
    sys.path.insert(0, str(bundle))
    try:
        import generate
    finally:
        sys.path.remove(str(bundle))
        sys.modules.pop("generate", None)
    return generate.Generator(bundle)


def _run(session, feeds):
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _prompts(lm):
    tokenizer = lm.preprocessor.tokenizer
    texts = ["def add(a", "for", "the quick brown"]
    return texts, [[tokenizer.bos_token_id] + tokenizer.tokenize(t) for t in texts]


def test_bundle_layout(bundle, lm):
    assert sorted(os.listdir(bundle)) == [
        "bundle.json", "decode.onnx", "generate.py", "generation_config.json", "prefill.onnx",
        "tokenizer.json", "tokenizer_config.json",
    ]
    spec = json.loads((bundle / "bundle.json").read_text())
    assert spec["kind"] == "decoder" and spec["family"] == "gpt" and spec["opset"] <= 18
    decode = spec["graphs"]["decode"]
    assert [i["name"] for i in decode["inputs"]] == ["input_ids", "attention_mask"] + [
        f"past_key_values.{i}.{part}" for i in range(2) for part in ("key", "value")
    ]
    inputs = {i["name"]: i for i in decode["inputs"]}
    assert inputs["past_key_values.1.value"]["shape"] == ["batch", "past_sequence", 2, 8]
    assert inputs["input_ids"]["shape"] == ["batch", 1] and inputs["input_ids"]["dtype"] == "int64"
    outputs = {o["name"]: o for o in spec["graphs"]["prefill"]["outputs"]}
    assert outputs["present.0.key"]["shape"] == ["batch", "sequence", 2, 8]
    config = json.loads((bundle / "generation_config.json").read_text())
    tokenizer = lm.preprocessor.tokenizer
    assert (config["bos_token_id"], config["eos_token_id"], config["max_length"]) == (
        tokenizer.bos_token_id, tokenizer.eos_token_id, 48)


def test_prefill_and_decode_match_keras(bundle, lm):
    """Random ids and a right-padded mask at shapes never seen during export; the caches feed the next step."""
    rng = np.random.default_rng(7)
    prefill = onnxruntime.InferenceSession(str(bundle / "prefill.onnx"))
    decode = onnxruntime.InferenceSession(str(bundle / "decode.onnx"))
    batch, length, vocabulary = 3, 11, lm.backbone.vocabulary_size
    ids = rng.integers(0, vocabulary, (batch, length))
    mask = (np.arange(length)[None, :] < np.array([[11], [6], [1]])).astype(np.int64)
    out = _run(prefill, {"input_ids": ids, "attention_mask": mask})
    expected = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": mask.astype(bool)}))
    rows = mask.astype(bool)  # padded query positions attend nothing real: compare real ones
    np.testing.assert_allclose(out["logits"][rows], expected[rows], atol=ATOL)
    # The keys/values of the real tokens are those Keras's cache holds.
    cache = np.zeros(lm.backbone.cache_shape(batch, length), "float32")
    _, keras_cache = lm.call_with_cache(ids.astype("int32"), cache, 0, padding_mask=mask.astype(bool))
    keras_cache = to_numpy(keras_cache)
    for i in range(2):  # ONNX (B, S, Hkv, Dh); Keras (B, L, 2, Hkv, S, Dh)
        np.testing.assert_allclose(out[f"present.{i}.key"], keras_cache[:, i, 0].transpose(0, 2, 1, 3), atol=ATOL)
        np.testing.assert_allclose(out[f"present.{i}.value"], keras_cache[:, i, 1].transpose(0, 2, 1, 3), atol=ATOL)

    # Three decode steps over full rows: logits of the last position of the growing sequence.
    mask = np.ones((batch, length), np.int64)
    out = _run(prefill, {"input_ids": ids, "attention_mask": mask})
    past = {f"past_key_values.{i}.{p}": out[f"present.{i}.{p}"] for i in range(2) for p in ("key", "value")}
    sequence = np.concatenate([ids, rng.integers(0, vocabulary, (batch, 3))], axis=1)
    expected = to_numpy(lm({"token_ids": sequence.astype("int32"), "padding_mask": np.ones(sequence.shape, bool)}))
    for position in range(length, length + 3):
        step = _run(decode, {"input_ids": sequence[:, position: position + 1],
                             "attention_mask": np.ones((batch, position + 1), np.int64), **past})
        np.testing.assert_allclose(step["logits"][:, 0], expected[:, position], atol=ATOL)
        assert step["present.1.key"].shape == (batch, position + 1, 2, 8)
        past = {f"past_key_values.{i}.{p}": step[f"present.{i}.{p}"] for i in range(2) for p in ("key", "value")}


def test_bundle_greedy_matches_keras(generator, lm):
    """The runner's tokens are `lm.generate`'s, and those of argmax over the full forward pass."""
    _, prompts = _prompts(lm)
    eos = lm.preprocessor.tokenizer.eos_token_id
    new = generator.generate_ids(prompts, max_new_tokens=12)
    assert [p + n for p, n in zip(prompts, new)] == lm.generate(prompts, max_new_tokens=12, sampler="greedy")
    assert new == [reference_greedy(causal_next_logits(lm), p, 12, eos) for p in prompts]
    assert any(row[-1] == eos and len(row) < 12 for row in new)  # a row stopped at its end token
    # One row at a time gives the same tokens as the batch.
    assert [generator.generate_ids([p], max_new_tokens=12)[0] for p in prompts] == new


@pytest.mark.parametrize("options", [
    {"num_beams": 3},
    {"num_beams": 4, "length_penalty": 2.0, "early_stopping": "never"},
])
def test_bundle_beam_matches_keras(generator, lm, options):
    _, prompts = _prompts(lm)
    new = generator.generate_ids(prompts, max_new_tokens=10, sampler="beam", **options)
    expected = lm.generate(prompts, max_new_tokens=10, sampler=BeamSampler(**options))
    assert [p + n for p, n in zip(prompts, new)] == expected


def test_bundle_random_sampling_matches_keras(generator, lm):
    """Same seed, same tokens as `RandomSampler` (the runner draws the noise the same way)."""
    _, prompts = _prompts(lm)
    options = {"temperature": 1.5, "top_k": 20, "top_p": 0.9, "seed": 3}
    new = generator.generate_ids(prompts, 10, sampler="random", **options)
    assert [p + n for p, n in zip(prompts, new)] == lm.generate(prompts, 10, sampler=RandomSampler(**options))
    assert new == generator.generate_ids(prompts, 10, sampler="random", **options)
    assert new != generator.generate_ids(prompts, 10, sampler="random", **{**options, "seed": 4})
    # top_k=1 leaves only the most likely token: greedy.
    assert generator.generate_ids(prompts, 10, sampler="random", seed=5, top_k=1) == generator.generate_ids(prompts, 10)


def test_cli_generate_with_the_bundle(bundle, generator, capsys):
    assert cli.main(["generate", str(bundle), "--prompt", "for", "--prompt", "def add(a", "--max-new-tokens", "5",
                     "--sampler", "beam", "--num-beams", "2"]) == 0
    expected = generator.generate(["for", "def add(a"], max_new_tokens=5, sampler="beam", num_beams=2)
    assert capsys.readouterr().out == "".join(text + "\n" for text in expected)


def test_bundle_text_and_errors(generator, lm):
    texts, prompts = _prompts(lm)
    tokenizer = lm.preprocessor.tokenizer
    new = generator.generate_ids(prompts, max_new_tokens=6)
    assert generator.generate(texts, max_new_tokens=6) == [
        tokenizer.detokenize(np.array(p + n)) for p, n in zip(prompts, new)
    ]
    with pytest.raises(ValueError, match="sampler"):
        generator.generate(texts, sampler="nucleus")
    with pytest.raises(ValueError, match="max_length=48"):
        generator.generate_ids(prompts, max_new_tokens=46)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.generate_ids(prompts, max_new_tokens=0)


RUNNER = """
import json, runpy, sys, io, contextlib
bundle = sys.argv[1]
sys.argv = [bundle + "/generate.py", "--prompt", "def add(a", "--prompt", "for", "--max-new-tokens", "6"]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_path(bundle + "/generate.py", run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
frameworks = sorted(name for name in %r if name in sys.modules)
print(json.dumps({"lines": out.getvalue().splitlines(), "frameworks": frameworks}))
""" % (FRAMEWORKS,)


def test_runner_needs_no_framework(bundle, generator):
    """`python BUNDLE/generate.py` imports neither Keras nor any backend, and prints what Generator gives."""
    result = run_python(RUNNER, bundle)
    assert result["frameworks"] == []
    expected = generator.generate(["def add(a", "for"], max_new_tokens=6)
    assert result["lines"] == "\n".join(expected).splitlines()


EXPORT_UNDER_TENSORFLOW = """
import json, sys
from keras_transformer.export import load_preset_task
load_preset_task(sys.argv[1]).export(sys.argv[2])
print(json.dumps({}))
"""


def test_artifacts_identical_to_a_tensorflow_export(bundle, lm, tmp_path):
    """The same weights exported by a fresh TensorFlow process: the very same files."""
    lm.save_to_preset(tmp_path / "preset")
    run_python(EXPORT_UNDER_TENSORFLOW, tmp_path / "preset", tmp_path / "again", env={"KERAS_BACKEND": "tensorflow"})
    assert sorted(os.listdir(tmp_path / "again")) == sorted(os.listdir(bundle))
    for name in os.listdir(bundle):
        assert (tmp_path / "again" / name).read_bytes() == (bundle / name).read_bytes(), name
