"""The weights files of a preset: checked against the model before loading, saved without the optimizer."""

import h5py
from keras.src.saving import saving_lib


def check_weight_shapes(model, weights_path):
    """Compare every saved array shape with the model's variables before touching any variable."""
    try:
        with h5py.File(weights_path, "r") as f:
            saved = []
            f.visititems(
                lambda name, obj: (
                    saved.append(tuple(obj.shape))
                    if isinstance(obj, h5py.Dataset) and not name.startswith("optimizer/")
                    else None
                )
            )
    except (OSError, RuntimeError, KeyError, ValueError) as error:  # h5py's errors for damaged files
        raise ValueError(f"Corrupt or truncated weights file {weights_path}: {error}") from None
    expected = [tuple(v.shape) for v in model.weights]
    if sorted(saved) != sorted(expected):
        missing = sorted(set(expected) - set(saved))
        extra = sorted(set(saved) - set(expected))
        raise ValueError(
            f"The weights in {weights_path} do not match the model built from its config "
            f"({len(saved)} arrays saved, {len(expected)} expected; shapes only in the model: {missing[:5]}, "
            f"only in the file: {extra[:5]}). Nothing was loaded."
        )


def load_weights(model, path, config, filename):
    """Load `path / filename` into `model` after checking its shapes; without the file, the weights a
    converter supplied in memory (`config["weights"]`), if any."""
    weights = path / filename
    if not weights.is_file():
        if "weights" in config:  # a converter supplied them in memory
            config["weights"](model)
        return
    check_weight_shapes(model, weights)
    model.load_weights(str(weights))


def save_weights_without_optimizer(model, path):
    """A preset holds the model, not the training state (checkpoints are for resuming)."""
    optimizer = getattr(model, "optimizer", None)
    saving_lib.save_weights_only(model, str(path), objects_to_skip=[optimizer] if optimizer is not None else None)
