"""The exports' memory is bounded by the weights (issue 37): a model of about 50M parameters, exported from the
backend under test in a child process, peaks at most 3x its float32 weights above what the exporting process holds
before it starts; an ONNX bundle on disk is about the size of the weights.

Before the weights were traced as graph inputs and written once to `weights.data`, TensorFlow and tf2onnx copied
every weight at each pass: a 42M-parameter model (4 layers of SmolLM2-135M's shape) peaked at 12.6 GB, 74x its
weights (benchmarks/RESULTS.md, "Export of real checkpoints"). The SavedModel's graphs grew with the number of
layers instead: every block traced into every signature at each call, 4.8x the weights of a 24-layer model above
the exporter at rest ("SavedModel export memory"). These are bounds on memory, not timed tests.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

from tests.export.helpers import REPO

pytestmark = pytest.mark.slow

# About 50M parameters, most of them in the tied embedding table, as in the small checkpoints people deploy.
CONFIG = dict(
    vocabulary_size=49152,
    num_layers=2,
    num_heads=12,
    num_key_value_heads=4,
    hidden_dim=768,
    intermediate_dim=2048,
    max_sequence_length=1024,
)
# Deep and narrow (41M parameters, most of them in 24 layers): what grew with the layers shows against the weights.
DEEP = dict(
    vocabulary_size=8000,
    num_layers=24,
    num_heads=6,
    num_key_value_heads=2,
    hidden_dim=384,
    intermediate_dim=1024,
    max_sequence_length=1024,
)

# Run as `python -c CHILD backend out_dir mode`: mode "export" (or "export-int8") builds the model on `backend` and
# exports it (into out_dir/mode; in that process: its graphs are the ONNX kernels'); mode "saved_model" exports its
# SavedModel (in that process on TensorFlow, else in a TensorFlow child); "huggingface" its Hugging Face folder (in
# that process). Mode "baseline-onnx" builds it under TensorFlow with the ONNX exporter's libraries imported and stops
# there, "baseline-saved_model" with TensorFlow only (all the SavedModel needs), "baseline-huggingface" on `backend`
# with torch, transformers and its Llama model class imported. Prints the peak RSS of the process and of its children.
CHILD = """
import json, os, resource, sys
backend, out, mode = sys.argv[1:4]
os.environ["KERAS_BACKEND"] = backend
import keras, numpy as np
from keras_transformer.models import LlamaBackbone, LlamaCausalLM
keras.utils.set_random_seed(0)
lm = LlamaCausalLM(LlamaBackbone(**json.loads(os.environ["KT_TEST_CONFIG"])))
info = {"bytes": sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in lm.weights)}
if mode.startswith(("export", "baseline-onnx")):  # the distinct weights' bytes, which a bundle stores once
    weights = [keras.ops.convert_to_numpy(v) for v in lm.weights]
    info["distinct_bytes"] = sum({(w.dtype.str, w.tobytes()): w.nbytes for w in weights}.values())
    del weights
if mode.startswith("export"):
    quantize = mode.split("-")[1] if "-" in mode else None
    lm.export(os.path.join(out, mode), format="onnx", quantize=quantize)
elif mode == "saved_model":
    lm.export(os.path.join(out, mode), format="tf_saved_model")
elif mode == "huggingface":
    lm.export(os.path.join(out, mode), format="huggingface")
elif mode == "baseline-saved_model":
    import tensorflow
elif mode == "baseline-huggingface":  # the libraries the Hugging Face export imports, and its model class
    import torch, transformers
    transformers.LlamaForCausalLM
else:
    import onnx, onnxruntime, tensorflow, tf2onnx
peak = lambda who: resource.getrusage(who).ru_maxrss * 1024
info.update(peak=peak(resource.RUSAGE_SELF), children_peak=peak(resource.RUSAGE_CHILDREN))
print("RESULT " + json.dumps(info))
"""


def _run(backend, out, mode, config=CONFIG):
    env = dict(os.environ, KT_TEST_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", CHILD, backend, str(out), mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_onnx_export_memory_and_bundle_size_are_bounded_by_the_weights(tmp_path):
    """Float and int8 bundles: peak RSS at most 3x the float32 weights above the exporter at rest; on disk, the
    float bundle about the weights, the int8 bundle (its quantized weights once) under half of them."""
    backend = keras.config.backend()
    baseline = _run("tensorflow", tmp_path, "baseline-onnx")  # TensorFlow, the exporter's libraries and the model
    for mode, largest in (("export", 1.1), ("export-int8", 0.5)):
        exported = _run(backend, tmp_path, mode)
        weights = exported["bytes"]
        assert 45e6 * 4 < weights < 55e6 * 4  # about 50M float32 parameters
        peak = max(exported["peak"], exported["children_peak"])  # the exporting process, whichever it is
        growth = peak - baseline["peak"]
        assert growth <= 3 * weights, (
            f"{mode}: {weights / 1e6:.0f} MB of weights peaked {growth / 1e6:.0f} MB above the exporter's "
            f"{baseline['peak'] / 1e6:.0f} MB at rest ({growth / weights:.1f}x the weights; bound 3x)"
        )
        bundle = tmp_path / mode
        on_disk = sum(path.stat().st_size for path in bundle.iterdir() if path.suffix in (".onnx", ".data"))
        assert on_disk <= largest * weights, (mode, on_disk, exported)
        if mode == "export":  # each distinct weight once (a random model has some equal tensors, stored once)
            assert exported["distinct_bytes"] <= on_disk, (on_disk, exported)
        else:  # int8 weights: at least a quarter of the distinct float bytes
            assert on_disk >= exported["distinct_bytes"] / 4, (on_disk, exported)


def test_saved_model_export_memory_is_bounded_by_the_weights(tmp_path):
    """The SavedModel of a 24-layer model: peak RSS at most 3x the float32 weights above the exporter at rest."""
    baseline = _run("tensorflow", tmp_path, "baseline-saved_model", DEEP)
    exported = _run(keras.config.backend(), tmp_path, "saved_model", DEEP)
    weights = exported["bytes"]
    assert 38e6 * 4 < weights < 44e6 * 4  # about 41M float32 parameters
    growth = max(exported["peak"], exported["children_peak"]) - baseline["peak"]
    assert growth <= 3 * weights, (
        f"{weights / 1e6:.0f} MB of weights peaked {growth / 1e6:.0f} MB above the exporter's "
        f"{baseline['peak'] / 1e6:.0f} MB at rest ({growth / weights:.1f}x the weights; bound 3x)"
    )
    assert (tmp_path / "saved_model" / "saved_model.pb").is_file()


def test_hugging_face_export_memory_is_bounded_by_the_weights(tmp_path):
    """The Hugging Face folder: peak RSS at most half the float32 weights above the exporter at rest with torch and
    transformers imported. The tensors stream one at a time; the embedding, most of this model, straight from its
    variable a block at a time (a copy of it and its element numbers were 1.5x the weights)."""
    backend = keras.config.backend()
    baseline = _run(backend, tmp_path, "baseline-huggingface")
    exported = _run(backend, tmp_path, "huggingface")
    weights = exported["bytes"]
    assert 45e6 * 4 < weights < 55e6 * 4  # about 50M float32 parameters
    growth = exported["peak"] - baseline["peak"]
    assert growth <= 0.5 * weights, (
        f"{weights / 1e6:.0f} MB of weights peaked {growth / 1e6:.0f} MB above the exporter's "
        f"{baseline['peak'] / 1e6:.0f} MB at rest ({growth / weights:.2f}x the weights; bound 0.5x)"
    )
    assert (tmp_path / "huggingface" / "model.safetensors").stat().st_size >= weights
