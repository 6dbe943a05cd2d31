"""Fail early, in one line, when the chosen Keras backend is not installed."""

import importlib.util
import os

_BACKEND_PACKAGES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def check_backend_installed():
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    package = _BACKEND_PACKAGES.get(backend)
    if package is None:
        return
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError(
            f"KERAS_BACKEND={backend!r} but {package!r} is not installed: "
            f"pip install 'keras-transformer[{backend}]'"
        )
