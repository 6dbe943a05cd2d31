"""Fail early, in one line that says the fix, when the chosen Keras backend is not installed or misspelled."""

import difflib
import importlib.util
import os

_BACKEND_PACKAGES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
_OTHER_KERAS_BACKENDS = ("numpy", "openvino")  # Keras knows them; left to Keras to load
_ALIASES = {"pytorch": "torch", "tf": "tensorflow", "tensorflow2": "tensorflow", "jaxlib": "jax"}


def check_backend_installed():
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend in _OTHER_KERAS_BACKENDS:
        return
    installed = [name for name, package in _BACKEND_PACKAGES.items() if _installed(package)]
    if backend not in _BACKEND_PACKAGES:
        names = {**{name: name for name in _BACKEND_PACKAGES}, **_ALIASES}
        close = [names[name] for name in difflib.get_close_matches(backend.lower(), names, n=1, cutoff=0.6)]
        hint = f" Did you mean KERAS_BACKEND={close[0]}?" if close else ""
        raise ImportError(
            f"KERAS_BACKEND={backend!r} is not a Keras backend keras_transformer runs on: use one of "
            f"{', '.join(_BACKEND_PACKAGES)}.{hint}"
        )
    package = _BACKEND_PACKAGES[backend]
    if package not in installed:
        others = [name for name in installed if name != backend]
        alternative = f", or run on an installed backend: KERAS_BACKEND={others[0]}" if others else ""
        raise ImportError(
            f"KERAS_BACKEND={backend!r} but {package!r} is not installed: "
            f"pip install 'keras-transformer[{backend}]'{alternative}"
        )


def _installed(package):
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False
