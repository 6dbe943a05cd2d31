"""Nothing is lost: training resumed from a checkpoint continues exactly, and an interrupted save
keeps the previous copy (no temporary files left behind).

The reference is the invariant itself: N + M steps in one run == N steps, checkpoint, reload
(a new model object, as in a new process), M steps. Tiny GPT, no dropout, fixed batches.
"""

import os

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.presets import saving as preset_saving
from tests.conftest import to_numpy

VOCAB, ROWS, LENGTH, BATCH = 50, 8, 8, 4  # 2 steps per epoch


def _build(initial_weights=None):
    backbone = kt.models.GPTBackbone(
        vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16
    )
    lm = kt.models.GPTCausalLM(backbone)
    if initial_weights is not None:
        lm.set_weights(initial_weights)
    # AdamW: its moments and step count are the state a resume needs. Eager: 4 steps cost less than a compile.
    lm.compile(run_eagerly=True)
    return lm


def _data():
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, VOCAB, (ROWS, LENGTH)).astype("int32"),
        "padding_mask": np.ones((ROWS, LENGTH), bool),
    }
    return x, rng.integers(0, VOCAB, (ROWS, LENGTH)).astype("int32")


def _fit(lm, epochs, **kwargs):
    x, y = _data()
    return lm.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, **kwargs).history["loss"]


def _weights(lm):
    return [to_numpy(v) for v in lm.weights]


@pytest.fixture(scope="module")
def uninterrupted():
    """(initial weights, losses of epochs 1 and 2, final weights, the trained model): 4 steps in one run."""
    lm = _build()
    initial = [to_numpy(w) for w in lm.get_weights()]
    losses = _fit(lm, epochs=2)
    return initial, losses, _weights(lm), lm


def _assert_same_run(losses, weights, expected_losses, expected_weights):
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6, atol=0)
    assert len(weights) == len(expected_weights)
    for actual, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)


def test_keras_checkpoint_and_load_model_resume_exactly(uninterrupted, tmp_path):
    initial, expected_losses, expected_weights, _ = uninterrupted
    path = tmp_path / "lm.keras"
    lm = _build(initial)
    first = _fit(lm, epochs=1, callbacks=[keras.callbacks.ModelCheckpoint(str(path))])
    del lm
    resumed = keras.saving.load_model(path)  # safe_mode (the default)
    assert type(resumed) is kt.models.GPTCausalLM
    assert int(to_numpy(resumed.optimizer.iterations)) == ROWS // BATCH  # the optimizer state came back
    second = _fit(resumed, epochs=1)
    _assert_same_run(first + second, _weights(resumed), expected_losses, expected_weights)
    assert sorted(os.listdir(tmp_path)) == ["lm.keras"]


def test_backup_and_restore_resumes_after_an_interruption(uninterrupted, tmp_path):
    initial, expected_losses, expected_weights, _ = uninterrupted
    backup = tmp_path / "backup"

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt("injected after epoch 1")

    with pytest.raises(KeyboardInterrupt):
        _fit(_build(initial), epochs=2, callbacks=[keras.callbacks.BackupAndRestore(str(backup)), Interrupt()])
    assert backup.is_dir()
    restarted = _build(initial)  # a new model from the same starting point, as in a new process
    losses = _fit(restarted, epochs=2, callbacks=[keras.callbacks.BackupAndRestore(str(backup))])
    assert len(losses) == 1  # only the second epoch ran
    _assert_same_run(losses, _weights(restarted), expected_losses[1:], expected_weights)
    assert not backup.exists()  # removed once training finished


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt("injected mid-save")


@pytest.mark.parametrize("filename", ["lm.keras", "lm.weights.h5"])
def test_interrupted_checkpoint_keeps_the_previous_file(uninterrupted, tmp_path, monkeypatch, filename):
    *_, lm = uninterrupted
    path = tmp_path / filename
    save = lm.save if filename.endswith(".keras") else lm.save_weights
    save(path)
    before = path.read_bytes()
    # The optimizer's state is written after the config and the layers' weights: halfway.
    monkeypatch.setattr(lm.optimizer, "save_own_variables", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        save(path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [filename]  # no temporary file or directory left
    monkeypatch.undo()
    if filename.endswith(".keras"):
        restored = keras.saving.load_model(path)
    else:
        restored = _build()
        restored.optimizer.build(restored.trainable_variables)
        restored.load_weights(path)
    for actual, expected in zip(_weights(restored), _weights(lm)):
        np.testing.assert_array_equal(actual, expected)


def test_save_to_preset_interrupted_at_its_last_file_keeps_the_previous_copy(uninterrupted, tmp_path, monkeypatch):
    *_, lm = uninterrupted
    target = tmp_path / "preset"
    lm.save_to_preset(target)
    before = {name: (target / name).read_bytes() for name in os.listdir(target)}
    monkeypatch.setattr(preset_saving, "_metadata", _interrupt)  # every weights file is written by then
    with pytest.raises(KeyboardInterrupt):
        lm.save_to_preset(target)
    assert {name: (target / name).read_bytes() for name in os.listdir(target)} == before
    assert os.listdir(tmp_path) == ["preset"]
