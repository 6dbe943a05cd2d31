"""The errors a newcomer meets first say the fix: over-long text, a mistyped preset, a backend, export's extra.

Each case goes through the entry point a newcomer uses (`fit`, `from_preset`, `import`, the
command line), not a helper, and checks that the message names what to do.
"""

import os
import subprocess
import sys

import pytest

import keras_transformer as kt
from keras_transformer import cli, export, presets


def test_over_long_text_in_fit_names_packing():
    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("gpt_tiny"))
    backbone = kt.models.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    lm = kt.models.GPTCausalLM(backbone, kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=32))
    document = "def f(x):\n    return x\n" * 20
    with pytest.raises(ValueError, match=r"A sequence of \d+ tokens is longer than `sequence_length`=32") as error:
        lm.fit([document, "x = 1"], epochs=1, verbose=0)
    assert "packing=True" in str(error.value) and "truncate=True" in str(error.value)
    lm.preprocessor.packing = True  # the fix the message names (fit on packed documents: tests/models/test_packing.py)
    x, _, weights = lm.preprocessor([document, "x = 1"])
    assert x["token_ids"].shape[1] == 32 and weights.sum() == len(tokenizer.tokenize(document)) + 5  # 2 ends, "x = 1"


@pytest.mark.parametrize(
    "typo, best",
    [("gpt_stdlb", "gpt_stdlib"), ("GPT-tiny", "gpt_tiny"), ("bert tiny", "bert_tiny"), ("t5-smal", "t5_small")],
)
def test_mistyped_preset_suggests_the_closest_names(typo, best):
    with pytest.raises(ValueError, match=rf"Unknown preset {typo!r}.*Did you mean {best!r}") as error:
        kt.models.Backbone.from_preset(typo)
    assert "Registered presets: " + ", ".join(sorted(row["name"] for row in kt.list_presets())) in str(error.value)
    assert presets.closest_presets(typo, [row["name"] for row in kt.list_presets()])[0] == best


def test_preset_of_another_family_lists_the_fitting_presets():
    with pytest.raises(
        ValueError,
        match=r"holds a BertBackbone, not a GPTBackbone\. Presets for a GPTBackbone: "
        r"gpt_medium, gpt_small, gpt_stdlib, gpt_tiny\.",
    ):
        kt.models.GPTCausalLM.from_preset("bert_tiny", load_weights=False)


def test_command_line_suggests_the_preset_and_names_the_export_extra(tmp_path, capsys, monkeypatch):
    assert cli.main(["export", "gpt_stdlb", str(tmp_path / "out")]) == 2
    assert "Did you mean 'gpt_stdlib'" in capsys.readouterr().err
    monkeypatch.setattr(export, "_installed", lambda package: package != "onnx")  # as without the extra
    assert cli.main(["export", "gpt_stdlib", str(tmp_path / "out"), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "needs onnx, which is not installed: pip install 'keras-transformer[export]'" in err
    assert list(tmp_path.iterdir()) == []


def _import_with(backend, blocked=None, tmp_path=None):
    env = {"KERAS_BACKEND": backend, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if blocked:  # a sitecustomize that makes `blocked` look not installed
        (tmp_path / "sitecustomize.py").write_text(
            "import importlib.abc, sys\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name == {blocked!r} or name.startswith({blocked + '.'!r}):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
        )
        env["PYTHONPATH"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-c", "import keras_transformer"], env=env, capture_output=True, text=True, timeout=120
    )


def test_backend_not_installed_names_the_extra_and_an_installed_backend(tmp_path):
    result = _import_with("jax", blocked="jax", tmp_path=tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "KERAS_BACKEND='jax' but 'jax' is not installed: pip install 'keras-transformer[jax]'" in last
    assert "or run on an installed backend: KERAS_BACKEND=tensorflow" in last


@pytest.mark.parametrize("typo, meant", [("pytorch", "torch"), ("tf", "tensorflow"), ("jaxx", "jax")])
def test_misspelled_backend_suggests_the_name(typo, meant):
    result = _import_with(typo)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert f"KERAS_BACKEND={typo!r} is not a Keras backend keras_transformer runs on" in last
    assert f"Did you mean KERAS_BACKEND={meant}?" in last
