"""The weights a JAX or PyTorch process hands to the TensorFlow child that traces its export.

The child rebuilds the model from its config. Built the usual way, and then loaded from a preset, every
variable would first hold random values and then take the loaded ones: the child would hold the model's weights
about twice while loading, and keep allocator pools it filled doing so. Here instead:

- the parent writes each of `model.weights`, in order, to one raw file (`write_weights`), straight from the
  host memory the backend already holds it in, with a manifest of shapes, dtypes and offsets;
- the child builds the model inside a `keras.StatelessScope`, which leaves every variable uninitialized, and
  gives each weight an initializer that reads its own bytes from that file (`build_with_weights`). On leaving
  the scope Keras initializes the variables one at a time, so the child holds each weight once, plus one
  weight's read at a time.

The file is a hand-over between two processes of the same library version, not a format for users: presets
and checkpoints are written by `save_to_preset` and the converters.
"""

import json
from pathlib import Path

import keras
import ml_dtypes
import numpy as np

from keras_transformer import presets
from keras_transformer.convert.streamed_tensor import host_view
from keras_transformer.models.quantization import quantization_mode

DATA_FILE, MANIFEST_FILE = "weights.bin", "weights.json"
_ALIGNMENT = 64  # each weight starts on 64 bytes, as numpy allocates


def _numpy_dtype(name):
    """A Keras dtype name -> numpy's dtype (bfloat16 and the float8 types from `ml_dtypes`, as Keras does)."""
    return np.dtype(getattr(ml_dtypes, name, name))


def hand_over(task, directory):
    """Write what the TensorFlow child needs to rebuild `task` into `directory`; returns the child's arguments
    (`python -m keras_transformer.export ARGS --write-into ...`).

    A preset without weights and `write_weights`' file; a quantized task goes as a whole preset instead: its layers
    are quantized after they are built, from float weights that are not handed over.
    """
    preset, weights = Path(directory) / "preset", Path(directory) / "weights"
    if quantization_mode(task) is not None:
        task.save_to_preset(preset)
        return [str(preset)]
    presets.save_task(task, preset, weights=False)
    write_weights(task, weights)
    return [str(preset), "--weights", str(weights)]


def write_weights(model, directory):
    """Write `model.weights`, in order, to `directory` (DATA_FILE and MANIFEST_FILE); one weight is copied out of
    the backend at a time where it does not live in host memory (a GPU), none where it does."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = []
    with open(directory / DATA_FILE, "wb") as data:
        for variable in model.weights:
            array = host_view(variable)
            if array is None:
                array = keras.ops.convert_to_numpy(variable)
            array = np.ascontiguousarray(array)
            data.write(b"\0" * (-data.tell() % _ALIGNMENT))
            entry = {"path": variable.path, "shape": list(variable.shape), "dtype": variable.dtype}
            manifest.append({**entry, "offset": data.tell(), "nbytes": int(array.nbytes)})
            data.write(array.reshape(-1).view("u1"))  # (N,) values -> (N * itemsize,) bytes, no copy
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")


def build_with_weights(build, directory):
    """`build()` (which builds a model and loads no weights), its `weights` initialized from `directory` (written
    by `write_weights` for a model of the same config) instead of their initializers.

    A ValueError when the built model's weights differ from the manifest's in number, shape or dtype.
    """
    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
    with keras.StatelessScope():  # variables created here stay uninitialized until the scope ends
        model = build()
        _check(model.weights, manifest, directory)
        for variable, entry in zip(model.weights, manifest):
            variable._initializer = _reader(directory / DATA_FILE, entry)  # Keras keeps no public hook for this
    return model  # the scope's end initialized every variable it created: the weights from the file


def _reader(path, entry):
    """An initializer returning the weight `entry` describes, read from `path` when called (once)."""

    def read(shape, dtype=None):
        del dtype  # the manifest's, checked against the variable's
        values = np.fromfile(path, dtype="u1", count=entry["nbytes"], offset=entry["offset"])
        return values.view(_numpy_dtype(entry["dtype"])).reshape(shape)

    return read


def _check(weights, manifest, directory):
    built = [(list(v.shape), v.dtype) for v in weights]
    saved = [(entry["shape"], entry["dtype"]) for entry in manifest]
    if built != saved:
        first = next((i for i, (a, b) in enumerate(zip(built, saved)) if a != b), min(len(built), len(saved)))
        raise ValueError(
            f"The model built from its config has {len(built)} weights, and {directory / MANIFEST_FILE} lists "
            f"{len(saved)}; they first differ at weight {first} (built: "
            f"{built[first] if first < len(built) else None}, saved: {saved[first] if first < len(saved) else None})."
        )


__all__ = ["DATA_FILE", "MANIFEST_FILE", "build_with_weights", "hand_over", "write_weights"]
