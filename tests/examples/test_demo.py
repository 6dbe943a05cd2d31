"""`make demo`'s job (examples/demo.py) runs end to end on the current backend, in a few steps."""

import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_trains_samples_exports_and_runs_the_bundle(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo.py"),
            "--steps",
            "4",
            "--batch-size",
            "4",
            "--sequence-length",
            "32",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    stdout = completed.stdout
    assert f"on the {keras.config.backend()} backend" in stdout
    for stage in ("perplexity", "greedy", "top-p", "beam", "ONNX bundle", "Summary", "Everything was written"):
        assert stage.lower() in stdout.lower(), stage
    # It starts from the trained preset, and says how held-out perplexity moved.
    assert "gpt_stdlib: GPTCausalLM" in stdout
    before, after = (float(value) for value in re.search(r"held-out perplexity ([\d.]+) -> ([\d.]+)", stdout).groups())
    assert before < 500 and after < 500  # a trained model: a random one is in the thousands (vocabulary 4096)
    assert "repetition_penalty=" in stdout and "no_repeat_ngram_size=" in stdout
    bundle = next(path for path in out.iterdir() if (path / "generate.py").is_file())
    assert {"tokenizer.json", "generate.py"} <= {path.name for path in bundle.iterdir()}
    assert any(path.suffix == ".onnx" for path in bundle.iterdir())
    assert (out / "gpt_preset" / "config.json").is_file()
