"""The runtime an ONNX bundle carries, loaded from the bundle: its `generate.py` as a module.

Every ONNX bundle holds its own copy of the Keras-free runtime (export/runtime/, copied by the export), so
a bundle runs with the runtime it was exported with. The command line (`keras-transformer generate
BUNDLE`), the tests and the benchmarks load it from here. It lives outside `keras_transformer.export`,
whose package loads Keras, because running a bundle needs no Keras; this module imports only the
standard library.
"""

import importlib.util
from pathlib import Path


def load_bundle_runtime(bundle_dir):
    """The `generate.py` module a bundle carries (the runtime matching its format)."""
    path = Path(bundle_dir) / "generate.py"
    if not path.is_file():
        raise ValueError(f"{bundle_dir} has no generate.py: not a keras_transformer ONNX bundle.")
    spec = importlib.util.spec_from_file_location(f"_keras_transformer_bundle_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
