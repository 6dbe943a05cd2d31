"""Quiet first contact: `keras-transformer --help` loads no framework, and the commands that load
Keras print none of TensorFlow's C++ startup lines unless KERAS_TRANSFORMER_VERBOSE asks for them."""

import os
import subprocess
import sys
import time

import pytest

FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")
HELP = (
    "import sys\n"
    "from keras_transformer import cli\n"
    "try:\n"
    "    cli.main(['--help'])\n"
    "except SystemExit:\n"
    "    pass\n"
    f"print('LOADED', [m for m in {FRAMEWORKS!r} if m in sys.modules])\n"
)


def _run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_help_loads_no_framework_and_prints_no_log():
    start = time.perf_counter()
    result = _run(["-c", HELP])
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert "usage: keras-transformer" in result.stdout
    assert "LOADED []" in result.stdout  # Keras and the backends stay unloaded
    assert result.stderr == ""
    # The budget is 1 s; a loaded framework takes several. Generous here: the test machine is shared.
    assert seconds < 3.0


def _presets_command(**env):
    # TensorFlow is the backend whose C++ startup lines this is about.
    return _run(["-m", "keras_transformer.cli", "presets"], KERAS_BACKEND="tensorflow", **env)


def test_commands_load_keras_without_the_startup_log():
    quiet = _presets_command(KERAS_TRANSFORMER_VERBOSE="0")
    assert quiet.returncode == 0, quiet.stderr
    assert "gpt_stdlib" in quiet.stdout
    assert quiet.stderr == ""


def test_verbose_brings_the_startup_log_back():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-m", "keras_transformer.cli", "presets"], capture_output=True, text=True,
                            timeout=300, env={**env, "KERAS_BACKEND": "tensorflow", "KERAS_TRANSFORMER_VERBOSE": "1"})
    assert result.returncode == 0, result.stderr
    if result.stderr == "":
        pytest.skip("this TensorFlow build prints no startup lines, so there is nothing to bring back")
    assert "gpt_stdlib" in result.stdout


LATER_TENSORFLOW = (
    "import sys\n"
    "from keras_transformer import startup\n"
    "keras = startup.import_keras_quietly()\n"
    "keras.utils.set_random_seed(0)\n"  # seeds TensorFlow too where it is installed: loads it under JAX/PyTorch
    "print('TENSORFLOW', 'tensorflow' in sys.modules)\n"
)


def test_tensorflow_loaded_later_prints_no_startup_log():
    """Under JAX or PyTorch, Keras imports TensorFlow on first use (`make demo`'s `set_random_seed`): that
    import is quiet too (it printed TensorFlow's C++ startup lines between the demo's stages)."""
    result = _run(["-c", LATER_TENSORFLOW], KERAS_TRANSFORMER_VERBOSE="0")
    assert result.returncode == 0, result.stderr
    if "TENSORFLOW True" not in result.stdout:
        pytest.skip("TensorFlow is not installed: Keras loads no TensorFlow later")
    assert result.stderr == ""
