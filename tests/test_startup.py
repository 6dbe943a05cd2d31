"""Quiet first contact: `keras-transformer --help` loads no framework, and the commands that load
Keras print none of TensorFlow's C++ startup lines unless KERAS_TRANSFORMER_VERBOSE asks for them."""

import os
import re
import subprocess
import sys

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
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def test_help_loads_no_framework_and_prints_no_log():
    """`--help` answers within its 1 s budget because it loads no framework (one takes seconds): the test checks
    the cause, what is loaded, not a time that depends on the machine and its load."""
    result = _run(["-c", HELP])
    assert result.returncode == 0, result.stderr
    assert "usage: keras-transformer" in result.stdout
    assert "LOADED []" in result.stdout  # Keras and the backends stay unloaded
    assert result.stderr == ""


def _presets_command(**env):
    # TensorFlow is the backend whose C++ startup lines this is about.
    return _run(["-m", "keras_transformer.cli", "presets"], KERAS_BACKEND="tensorflow", **env)


def test_commands_load_keras_without_the_startup_log():
    quiet = _presets_command(KERAS_TRANSFORMER_VERBOSE="0")
    assert quiet.returncode == 0, quiet.stderr
    assert "gpt_stdlib" in quiet.stdout
    assert quiet.stderr == ""


# A line of the C++ log TensorFlow and XLA write at startup (absl's format: "I0000 00:00:1795775978.562968 ...",
# severity, date, time), or absl's note that such lines go to stderr before its log is initialised.
STARTUP_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl)", re.M)


def test_verbose_brings_the_startup_log_back():
    """The same command as above, with KERAS_TRANSFORMER_VERBOSE=1 and TensorFlow's own log level (unset: INFO):
    TensorFlow's C++ startup lines are printed (at INFO it reports the CUDA drivers it found or not, the CPU
    instructions it was built without, the devices it created). An empty stderr fails: the lines were hidden,
    or this TensorFlow prints none and the test has nothing to show."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "presets"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "KERAS_BACKEND": "tensorflow", "KERAS_TRANSFORMER_VERBOSE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "gpt_stdlib" in result.stdout
    assert STARTUP_LOG_LINE.search(result.stderr), f"no startup log line on stderr: {result.stderr!r}"


QUIET_WRITE = (
    "import os\n"
    "from keras_transformer import startup\n"
    "with startup.quiet_startup():\n"
    "    os.write(2, b'C++ STARTUP LINE\\n')\n"  # as TensorFlow's C++ code writes: to descriptor 2, not sys.stderr
    "os.write(2, b'AFTER\\n')\n"
)


@pytest.mark.parametrize("verbose", ["0", "1"])
def test_quiet_startup_hides_descriptor_2_unless_verbose(verbose):
    """The mechanism on its own, whatever TensorFlow prints: what is written to file descriptor 2 inside
    `quiet_startup()` is dropped, unless KERAS_TRANSFORMER_VERBOSE asks for it; stderr is back afterwards."""
    result = _run(["-c", QUIET_WRITE], KERAS_TRANSFORMER_VERBOSE=verbose)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("C++ STARTUP LINE\nAFTER\n" if verbose == "1" else "AFTER\n")


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
