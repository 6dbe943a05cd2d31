"""The export entry point without real conversions: errors, missing dependencies, atomic writes, the CLI.

Fast: the conversions are replaced by fakes where a test is about what surrounds them.
"""

import subprocess
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest

from keras_transformer import cli, export
from keras_transformer.export import onnx as onnx_export
from keras_transformer.models import GPTBackbone, GPTCausalLM
from keras_transformer.models.task import Task
from tests.export.helpers import run_python


@pytest.fixture(scope="module")
def lm():
    backbone = GPTBackbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16
    )
    return GPTCausalLM(backbone)


def _tiny_onnx_model():
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    return onnx.helper.make_model(graph)


def test_unknown_format(lm, tmp_path):
    with pytest.raises(ValueError, match="format='tflite'"):
        lm.export(tmp_path / "out", format="tflite")
    assert list(tmp_path.iterdir()) == []


def test_unsupported_models(lm, tmp_path):
    with pytest.raises(ValueError, match="keras_transformer task"):
        export.export_model(lm.backbone, tmp_path / "out")
    bare = Task(inputs=lm.backbone.input, outputs=lm.backbone.output)  # a task no family defines
    with pytest.raises(ValueError, match="not an exportable task"):
        export.export_model(bare, tmp_path / "out")
    with pytest.raises(ValueError, match="Unexpected arguments"):
        lm.export(tmp_path / "out", input_signature=[])
    assert list(tmp_path.iterdir()) == []


def test_float32_only(tmp_path):
    backbone = GPTBackbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dtype="bfloat16"
    )
    with pytest.raises(ValueError, match="float32 models.*bfloat16"):
        GPTCausalLM(backbone).export(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_existing_directory_is_kept(lm, tmp_path):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="already exists"):
        lm.export(target)
    assert [p.name for p in target.iterdir()] == ["mine.txt"]


def test_missing_dependency_names_the_extra(lm, tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_installed", lambda package: package not in ("tf2onnx", "onnx"))
    with pytest.raises(
        ImportError, match=r"needs onnx, which is not installed: pip install 'keras-transformer\[export\]'"
    ):
        lm.export(tmp_path / "out", format="onnx")
    assert list(tmp_path.iterdir()) == []


BLOCKED_IMPORTS = """
import json, sys
for name in ("onnx", "tf2onnx", "onnxruntime"):  # as if not installed: import fails, find_spec gives None
    sys.modules[name] = None
import keras_transformer.cli, keras_transformer.export
import keras_transformer.export.graphs, keras_transformer.export.onnx, keras_transformer.export.saved_model
from keras_transformer.models import GPTBackbone, GPTCausalLM
lm = GPTCausalLM(GPTBackbone(50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16))
try:
    lm.export(sys.argv[1])
except ImportError as error:
    print(json.dumps({"error": str(error)}))
"""


@pytest.mark.slow
def test_importable_without_export_dependencies(tmp_path):
    result = run_python(BLOCKED_IMPORTS, tmp_path / "out")
    assert result["error"].startswith("Exporting to format='onnx' needs onnx, onnxruntime, which are not installed")
    assert result["error"].endswith("pip install 'keras-transformer[export]'")
    assert list(tmp_path.iterdir()) == []


WITHOUT_TRACING = """
import json, os, sys
from pathlib import Path
blocked = ["tf2onnx"] + (["tensorflow"] if os.environ["KERAS_BACKEND"] != "tensorflow" else [])
for name in blocked:  # as if not installed: import fails, find_spec gives None
    sys.modules[name] = None
from keras_transformer.models import BertBackbone, BertMaskedLM, GPTBackbone, GPTCausalLM
lm = GPTCausalLM(GPTBackbone(50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16))
lm.export(Path(sys.argv[1]) / "gpt")
encoder = BertMaskedLM(BertBackbone(50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16))
try:
    encoder.export(Path(sys.argv[1]) / "bert")
    error = None
except ImportError as caught:
    error = str(caught)
print(json.dumps({"blocked": blocked, "gpt": sorted(p.name for p in (Path(sys.argv[1]) / "gpt").iterdir()),
                  "bert": error, "left": sorted(p.name for p in Path(sys.argv[1]).iterdir())}))
"""


@pytest.mark.slow
def test_a_causal_lm_exports_to_onnx_without_tensorflow_or_tf2onnx(tmp_path):
    """The kernels build a causal LM's whole bundle: tf2onnx (and, off TensorFlow, TensorFlow itself) need not be
    installed. An encoder's graphs are traced: its export names what is missing and leaves nothing behind."""
    (tmp_path / "out").mkdir()
    result = run_python(WITHOUT_TRACING, tmp_path / "out")
    assert {"prefill.onnx", "decode.onnx", "weights.data"} <= set(result["gpt"])
    missing = ", ".join(name for name in ("tensorflow", "tf2onnx") if name in result["blocked"])
    assert result["bert"].startswith(
        f"Exporting to format='onnx' (this model's graphs are traced under TensorFlow) needs {missing}"
    )
    assert result["left"] == ["gpt"]


def test_failure_mid_export_leaves_nothing(lm, tmp_path, monkeypatch):
    """The first graph is written, the second fails: no bundle and no temporary directory remain. (A GPT's bundle is
    written in this process on every backend: its graphs are the ONNX kernels'.)"""
    calls = []

    def convert(graph, weights=None):
        calls.append(graph.name)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return _tiny_onnx_model()

    monkeypatch.setattr(onnx_export, "convert", convert)
    with pytest.raises(RuntimeError, match="injected failure"):
        lm.export(tmp_path / "bundle")
    assert calls, "the export did not reach the conversion"
    assert list(tmp_path.iterdir()) == []


def test_a_causal_lm_bundle_is_written_in_this_process(lm, tmp_path, monkeypatch):
    """A GPT's prefill and decode graphs are the ONNX kernels': no TensorFlow child process on any backend."""

    def child(*args, **kwargs):
        raise AssertionError("a TensorFlow child process was started")

    monkeypatch.setattr(export, "_write_in_tensorflow_child", child)
    lm.export(tmp_path / "bundle")
    assert {"prefill.onnx", "decode.onnx", "weights.data"} <= {path.name for path in (tmp_path / "bundle").iterdir()}


def test_a_long_export_says_where_it_is(lm, tmp_path, capsys):
    """verbose=True: a line per graph, a progress bar over the blocks; "auto" says nothing for a model this small."""
    lm.export(tmp_path / "quiet")
    assert capsys.readouterr().out == ""
    lm.export(tmp_path / "loud", verbose=True, quantize="int8")
    out = capsys.readouterr().out
    blocks = len(lm.backbone.transformer_layers)
    for graph in ("prefill", "decode"):
        assert f"{graph} graph (ONNX kernels, int8) ..." in out
        assert f"{graph} graph (ONNX kernels, int8): done in" in out
    assert f"{blocks}/{blocks}" in out
    with pytest.raises(ValueError, match="verbose='yes'"):
        lm.export(tmp_path / "bad", verbose="yes")


def test_failure_in_the_tensorflow_writer_leaves_nothing(lm, tmp_path, monkeypatch):
    """A SavedModel (written by a TensorFlow child process under JAX or PyTorch) fails half-written: nothing remains."""
    calls = []
    if keras.config.backend() == "tensorflow":

        def write_saved_model(task, directory):
            calls.append(directory)
            (Path(directory) / "saved_model.pb").write_bytes(b"partial")
            raise RuntimeError("injected failure")

        monkeypatch.setattr(export, "write_saved_model", write_saved_model)
    else:

        def run(command, **kwargs):  # the TensorFlow child writes one file, then fails
            calls.append(command)
            (Path(command[command.index("--write-into") + 1]) / "saved_model.pb").write_bytes(b"partial")
            return subprocess.CompletedProcess(command, 1, "", "Traceback ...\nRuntimeError: injected failure")

        monkeypatch.setattr(export.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="injected failure"):
        lm.export(tmp_path / "saved_model", format="tf_saved_model")
    assert calls, "the export did not reach the writer"
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_atomically(lm, tmp_path, monkeypatch):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "old.txt").write_text("old")

    def write(task, directory, format, quantize=None, verbose=False):
        (Path(directory) / "new.txt").write_text(format)

    monkeypatch.setattr(export, "write", write)
    monkeypatch.setattr(export, "_write_in_tensorflow_child", lambda task, targets: [write(task, *t) for t in targets])
    lm.export(target, format="tf_saved_model", overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert (target / "new.txt").read_text() == "tf_saved_model"
    # Several targets at once: each complete, nothing else left.
    paths = export.export_models(lm, {tmp_path / "a": "onnx", tmp_path / "b": "tf_saved_model"})
    assert paths == [tmp_path / "a", tmp_path / "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "bundle"]
    assert (tmp_path / "b" / "new.txt").read_text() == "tf_saved_model"
    with pytest.raises(ValueError, match="already exists"):
        export.export_models(lm, {tmp_path / "c": "onnx", tmp_path / "a": "onnx"})
    assert not (tmp_path / "c").exists()


def test_cli_presets_and_errors(capsys, tmp_path):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["name", "family", "parameters"]
    assert any(line.startswith("gpt_tiny ") for line in out.splitlines())
    assert cli.main(["export", "no_such_preset", str(tmp_path / "out")]) == 2
    assert "Unknown preset 'no_such_preset'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["export", "gpt_tiny", str(tmp_path / "out"), "--format", "tflite"])
    assert list(tmp_path.iterdir()) == []


def test_cli_commands_are_pluggable(capsys):
    @cli.command("hello", help="Say hello.")
    def _hello(parser):
        parser.add_argument("--name", default="world")
        return lambda args: print(f"hello {args.name}")

    try:
        assert cli.main(["hello", "--name", "keras"]) == 0
        assert capsys.readouterr().out == "hello keras\n"
    finally:
        cli._COMMANDS.pop("hello")


def test_load_preset_task_defaults_to_the_family_task(lm, tmp_path):
    lm.backbone.save_to_preset(tmp_path / "backbone_only")
    task = export.load_preset_task(tmp_path / "backbone_only")
    assert type(task).__name__ == "GPTCausalLM" and task.preprocessor is None
    ids = np.array([[1, 2, 3]], "int32")
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(task(inputs)), keras.ops.convert_to_numpy(lm(inputs)), atol=1e-6
    )
