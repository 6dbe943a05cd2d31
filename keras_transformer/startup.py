"""Quiet first contact: TensorFlow's and XLA's C++ startup log lines, silenced while Keras loads.

TensorFlow writes its startup lines (oneDNN, CUDA drivers, CPU instructions, "All log messages
before absl::InitializeLog()") straight to file descriptor 2 before any log level applies, so
`TF_CPP_MIN_LOG_LEVEL` alone does not hide them. The command line and the demo import Keras inside
`quiet_startup()`, which points descriptor 2 at the null device for that import only (Python
errors raised by the import still print) and sets `TF_CPP_MIN_LOG_LEVEL=3` unless it is set.

To see the lines again: `KERAS_TRANSFORMER_VERBOSE=1 keras-transformer ...` (or `make demo`).
"""

import contextlib
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
    """Import Keras (and the backend it loads) without the frameworks' startup lines; returns `keras`."""
    with quiet_startup():
        import keras

    return keras
