"""Quiet first contact: TensorFlow's and XLA's C++ startup log lines, silenced while Keras loads.

TensorFlow writes its startup lines (oneDNN, CUDA drivers, CPU instructions, "All log messages
before absl::InitializeLog()") straight to file descriptor 2 before any log level applies, so
`TF_CPP_MIN_LOG_LEVEL` alone does not hide them. The command line and the demo import Keras inside
`quiet_startup()`, which points descriptor 2 at the null device for that import only (Python
errors raised by the import still print) and sets `TF_CPP_MIN_LOG_LEVEL=3` unless it is set.
Under the JAX or PyTorch backend Keras imports TensorFlow later, on first use, when it is installed
(`keras.utils.set_random_seed` seeds it too): `import_keras_quietly` also makes that import quiet.

To see the lines again: `KERAS_TRANSFORMER_VERBOSE=1 keras-transformer ...` (or `make demo`).
"""

import contextlib
import importlib.abc
import importlib.util
import os
import sys

VERBOSE_ENV = "KERAS_TRANSFORMER_VERBOSE"


def verbose():
    """Whether the user asked for the frameworks' own startup logs."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def quiet_startup():
    """Silence the C++ startup logs written while the body runs (unless `KERAS_TRANSFORMER_VERBOSE` is set)."""
    if verbose():
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def import_keras_quietly():
    """Import Keras (and the backend it loads) without the frameworks' startup lines; returns `keras`.

    TensorFlow, when Keras loads it later (another backend seeding it, or its data utilities), loads
    quietly too."""
    if (
        not verbose()
        and "tensorflow" not in sys.modules
        and not any(isinstance(finder, _QuietTensorFlowImport) for finder in sys.meta_path)
    ):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
    with quiet_startup():
        import keras

    return keras


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Runs the `import tensorflow` that loads it inside `quiet_startup()`, whoever imports it and when."""

    def __init__(self):
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" or self._finding:
            return None
        self._finding = True  # the search below asks the other finders, and this one again
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def quiet_exec_module(module):
            with quiet_startup():
                exec_module(module)

        spec.loader.exec_module = quiet_exec_module  # this spec's own loader object: only this import
        return spec
