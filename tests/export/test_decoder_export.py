"""GPT (decoder-only) ONNX export on the current backend: the graphs and the bundle's runner.

The bundle is exported once per session (see conftest.py); the SavedModel is tested in
test_saved_model.py.
"""

import json
import os

import numpy as np
import onnx
import onnxruntime
import pytest

from keras_transformer import cli
from keras_transformer.samplers import BeamSampler, RandomSampler
from tests.export.helpers import (
    BUNDLE_RUNTIME_FILES,
    FRAMEWORKS,
    bundle_generator,
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
    return bundle_generator(bundle)


def _run(session, feeds):
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _prompts(lm):
    tokenizer = lm.preprocessor.tokenizer
    texts = ["def add(a", "for", "the quick brown"]
    return texts, [[tokenizer.bos_token_id] + tokenizer.tokenize(t) for t in texts]


def test_bundle_layout(bundle, lm):
    assert sorted(os.listdir(bundle)) == sorted(
        [
            "bundle.json",
            "decode.onnx",
            "generation_config.json",
            "prefill.onnx",
            "tokenizer.json",
            "tokenizer_config.json",
            "weights.data",
            *BUNDLE_RUNTIME_FILES,
        ]
    )
    spec = json.loads((bundle / "bundle.json").read_text())
    assert spec["kind"] == "decoder" and spec["family"] == "gpt" and spec["opset"] <= 18
    decode = spec["graphs"]["decode"]
    assert [i["name"] for i in decode["inputs"]] == ["input_ids", "position_ids"] + [
        f"past_key_values.{i}.{part}" for i in range(2) for part in ("key", "value")
    ]
    inputs = {i["name"]: i for i in decode["inputs"]}
    assert inputs["past_key_values.1.value"]["shape"] == ["batch", 2, "past_sequence", 8]
    assert {o["name"]: o for o in decode["outputs"]}["present.1.value"]["shape"] == ["batch", 2, "present_sequence", 8]
    assert inputs["input_ids"]["shape"] == ["batch", "sequence"] and inputs["input_ids"]["dtype"] == "int64"
    for name in ("prefill", "decode"):  # standard ops within opset 18; the decode step's attention is ONNX Runtime's
        opsets = {o.domain: o.version for o in onnx.load(bundle / f"{name}.onnx").opset_import}
        assert opsets.get("", 0) <= 18 and set(opsets) <= {"", "ai.onnx.ml", "com.microsoft"}, opsets
    outputs = {o["name"]: o for o in spec["graphs"]["prefill"]["outputs"]}
    assert outputs["present.0.key"]["shape"] == ["batch", "sequence", 2, 8]
    config = json.loads((bundle / "generation_config.json").read_text())
    tokenizer = lm.preprocessor.tokenizer
    assert (config["bos_token_id"], config["eos_token_id"], config["max_length"]) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        48,
    )


def test_graphs_share_one_weights_file(bundle, lm):
    """Every large initializer of both graphs points into weights.data; the decode graph's are all among the
    prefill's (the same bytes: the embedding table, the kernels reshaped), and the file holds about the weights."""
    from onnx import TensorProto

    pointers = {}
    for name in ("prefill", "decode"):
        model = onnx.load(bundle / f"{name}.onnx", load_external_data=False)
        external = [init for init in model.graph.initializer if init.data_location == TensorProto.EXTERNAL]
        assert {entry.value for init in external for entry in init.external_data if entry.key == "location"} == {
            "weights.data"
        }
        pointers[name] = {tuple(entry.value for entry in init.external_data)[1:] for init in external}
    assert pointers["decode"] and pointers["decode"] <= pointers["prefill"]
    weights = sum(np.prod(v.shape) * 4 for v in lm.weights)
    assert (bundle / "weights.data").stat().st_size <= 1.1 * weights


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
        for j, part in enumerate(("key", "value")):
            expected = keras_cache[:, i, j].transpose(0, 2, 1, 3)
            np.testing.assert_allclose(out[f"present.{i}.{part}"][rows], expected[rows], atol=ATOL)

    # Three decode steps over full rows: logits of the last position of the growing sequence.
    mask = np.ones((batch, length), np.int64)
    out = _run(prefill, {"input_ids": ids, "attention_mask": mask})
    # Prefill caches (B, S, Hkv, Dh) -> decode caches (B, Hkv, S, Dh), passed at exactly S positions: growing form.
    past = {
        f"past_key_values.{i}.{p}": out[f"present.{i}.{p}"].transpose(0, 2, 1, 3)
        for i in range(2)
        for p in ("key", "value")
    }
    sequence = np.concatenate([ids, rng.integers(0, vocabulary, (batch, 3))], axis=1)
    expected = to_numpy(lm({"token_ids": sequence.astype("int32"), "padding_mask": np.ones(sequence.shape, bool)}))
    for position in range(length, length + 3):
        step = _run(
            decode,
            {
                "input_ids": sequence[:, position : position + 1],
                "position_ids": np.full((batch, 1), position, np.int64),
                **past,
            },
        )
        np.testing.assert_allclose(step["logits"][:, 0], expected[:, position], atol=ATOL)
        assert step["present.1.key"].shape == (batch, 2, position + 1, 8)
        past = {f"past_key_values.{i}.{p}": step[f"present.{i}.{p}"] for i in range(2) for p in ("key", "value")}


def test_decode_writes_its_cache_in_place(bundle, lm):
    """Past and present bound to one buffer wider than needed: the step writes position S and nothing else,
    reads only positions [0, S], and gives Keras's logits (the runner's form)."""
    rng = np.random.default_rng(3)
    decode = onnxruntime.InferenceSession(str(bundle / "decode.onnx"))
    batch, length, width = 2, 9, 20
    ids = rng.integers(0, lm.backbone.vocabulary_size, (batch, length + 1))
    cache = np.zeros(lm.backbone.cache_shape(batch, length), "float32")
    _, keras_cache = lm.call_with_cache(ids[:, :length].astype("int32"), cache, 0)
    keras_cache = to_numpy(keras_cache)  # (B, L, 2, Hkv, S, Dh)
    binding = decode.io_binding()
    buffers = {}
    for i in range(2):
        for j, part in enumerate(("key", "value")):
            buffer = rng.standard_normal((batch, 2, width, 8)).astype(np.float32)  # garbage beyond position S
            buffer[:, :, :length] = keras_cache[:, i, j]
            buffers[(i, part)] = buffer
            value = onnxruntime.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(f"past_key_values.{i}.{part}", value)
            binding.bind_ortvalue_output(f"present.{i}.{part}", value)
    before = {key: buffer.copy() for key, buffer in buffers.items()}
    binding.bind_cpu_input("input_ids", ids[:, length:])
    binding.bind_cpu_input("position_ids", np.full((batch, 1), length, np.int64))
    binding.bind_output("logits")
    decode.run_with_iobinding(binding)
    logits = binding.copy_outputs_to_cpu()[-1]  # outputs come in the order they were bound
    expected = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}))
    np.testing.assert_allclose(logits[:, 0], expected[:, length], atol=ATOL)
    full = np.zeros(lm.backbone.cache_shape(batch, length + 1), "float32")
    _, full = lm.call_with_cache(ids.astype("int32"), full, 0)
    full = to_numpy(full)
    for (i, part), buffer in buffers.items():
        j = ("key", "value").index(part)
        np.testing.assert_allclose(buffer[:, :, length], full[:, i, j, :, length], atol=ATOL)
        untouched = np.ones(width, bool)
        untouched[length] = False
        np.testing.assert_array_equal(buffer[:, :, untouched], before[(i, part)][:, :, untouched])


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


@pytest.mark.parametrize(
    "options", [{"num_beams": 3}, {"num_beams": 4, "length_penalty": 2.0, "early_stopping": "never"}]
)
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
    assert (
        cli.main(
            [
                "generate",
                str(bundle),
                "--prompt",
                "for",
                "--prompt",
                "def add(a",
                "--max-new-tokens",
                "5",
                "--sampler",
                "beam",
                "--num-beams",
                "2",
            ]
        )
        == 0
    )
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


@pytest.mark.parametrize(
    "options",
    [
        {"num_key_value_heads": 1, "activation": "gelu"},  # grouped keys/values, exact gelu
        {"activation": "gated-silu"},
        {"activation": "relu"},
    ],
)
def test_decode_graph_variants_match_keras(options):
    """The decode graph built by the ONNX kernels, for GPTs the bundle fixture does not cover, against the Keras model:
    logits of the next position and the keys/values it appends (built in-process on any backend); and the prefill."""
    from keras_transformer.export.decode_graph import decode_model
    from keras_transformer.models import GPTBackbone, GPTCausalLM
    from tests.export.helpers import randomize
    from tests.export.test_decode_kernels import assert_prefill_matches_keras

    backbone = GPTBackbone(
        97, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=48, max_sequence_length=24, **options
    )
    lm = randomize(GPTCausalLM(backbone), seed=1)
    assert_prefill_matches_keras(lm)
    session = onnxruntime.InferenceSession(decode_model(lm).SerializeToString())
    batch, length, heads = 2, 7, options.get("num_key_value_heads", 4)
    ids = np.random.default_rng(5).integers(0, 97, (batch, length + 1))
    cache = np.zeros(backbone.cache_shape(batch, length + 1), "float32")
    _, cache = lm.call_with_cache(ids.astype("int32"), cache, 0)
    cache = to_numpy(cache)  # (B, L, 2, Hkv, S + 1, Dh): the Keras keys/values of every position
    past = {
        f"past_key_values.{i}.{part}": np.ascontiguousarray(cache[:, i, j, :, :length])
        for i in range(2)
        for j, part in enumerate(("key", "value"))
    }
    out = _run(session, {"input_ids": ids[:, length:], "position_ids": np.full((batch, 1), length, np.int64), **past})
    expected = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}))
    np.testing.assert_allclose(out["logits"][:, 0], expected[:, length], atol=ATOL)
    for i in range(2):
        for j, part in enumerate(("key", "value")):
            assert out[f"present.{i}.{part}"].shape == (batch, heads, length + 1, 8)
            np.testing.assert_allclose(out[f"present.{i}.{part}"], cache[:, i, j], atol=ATOL)
