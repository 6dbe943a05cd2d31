"""The compiled training step: the default compile on every backend, and PyTorch's one-graph step.

On PyTorch the reference is Keras's own eager `train_step` (`jit_compile=False`): the compiled step
must give the same per-step losses and weights over 20 steps (sample_weight; LoRA under
mixed_bfloat16), run as one graph without recompiling, be the path actually taken, and resume
from a `.keras` checkpoint exactly as an uninterrupted eager run continues. Compiling a tiny model
still takes a while on a CPU, so three models are compiled in the whole file and shared.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.models import compiled_step
from keras_transformer.models.compiled_train_step import CompiledTrainStep
from tests.conftest import to_numpy

VOCAB, LENGTH, BATCH, ROWS = 64, 8, 4, 20  # 5 steps per epoch
EPOCHS = 4  # 20 steps

torch_only = pytest.mark.skipif(
    keras.config.backend() != "torch", reason="the compiled train step is PyTorch's (JAX jits, TensorFlow uses XLA)"
)


def _build(seed=0):
    keras.utils.set_random_seed(seed)
    backbone = kt.models.GPTBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=LENGTH,
        dropout=0.0,
    )
    return kt.models.GPTCausalLM(backbone)


def _data():
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, VOCAB, (ROWS, LENGTH)).astype("int32"),
        "padding_mask": np.ones((ROWS, LENGTH), bool),
    }
    y = rng.integers(0, VOCAB, (ROWS, LENGTH)).astype("int32")
    sample_weight = rng.uniform(0.0, 2.0, (ROWS, LENGTH)).astype("float32")
    return x, y, sample_weight


class _StepLosses(keras.callbacks.Callback):
    """The running mean loss Keras reports after every step (the per-step losses follow from it)."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def _fit(lm, epochs, callbacks=()):
    x, y, w = _data()
    recorder = _StepLosses()
    lm.fit(
        x,
        y,
        sample_weight=w,
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[recorder, *callbacks],
    )
    return recorder.losses


def _weights(lm):
    return [to_numpy(v) for v in lm.weights]


def test_the_default_compile_is_the_fastest_on_every_backend():
    lm = _build()
    lm.compile()
    backend = keras.config.backend()
    if backend == "torch":  # Keras's own flag stays off: the task's step replaces Keras's torch.compile
        assert lm._compiled_train_step and lm.jit_compile is False
        assert lm.get_compile_config()["jit_compile"] == "auto"
    else:  # XLA on TensorFlow also without a GPU (Keras's own "auto" is off on a CPU); jit on JAX
        assert lm.jit_compile is True
    lm.compile(jit_compile=False)
    assert lm.jit_compile is False and not getattr(lm, "_compiled_train_step", False)
    lm.compile(run_eagerly=True)
    assert lm.jit_compile is False and not getattr(lm, "_compiled_train_step", False)
    with pytest.raises(ValueError, match="jit_compile.*Received: jit_compile='xla'"):
        lm.compile(jit_compile="xla")


@torch_only
def test_auto_trains_eagerly_until_the_run_is_long_enough():
    """A short fit (a test, a notebook cell on a tiny model) never pays for a compile."""
    lm = _build()
    lm.compile()
    _fit(lm, epochs=1)
    step = lm.train_function
    assert isinstance(step, CompiledTrainStep)
    assert step.warmup_seconds == compiled_step.COMPILE_AFTER_SECONDS
    assert (step.eager_steps, step.compiled_steps) == (ROWS // BATCH, 0)
    with pytest.raises(ValueError, match="warmup_seconds.*Received: warmup_seconds=-1"):
        CompiledTrainStep(lm, warmup_seconds=-1)


@pytest.fixture(scope="module")
def eager_run():
    """Keras's eager step: per-step losses over 2 + 2 epochs and the final weights."""
    lm = _build()
    initial = [to_numpy(w) for w in lm.get_weights()]
    lm.compile(jit_compile=False)
    losses = _fit(lm, epochs=EPOCHS // 2) + _fit(lm, epochs=EPOCHS // 2)
    assert not isinstance(lm.train_function, CompiledTrainStep)
    return initial, losses, _weights(lm)


@pytest.fixture(scope="module")
def compiled_run(eager_run, tmp_path_factory):
    """The same 2 epochs compiled, checkpointed; then loaded from the `.keras` file and trained 2 more."""
    initial = eager_run[0]
    path = tmp_path_factory.mktemp("compiled") / "lm.keras"
    lm = _build(seed=1)  # other weights, replaced: the compiled step must read the variables' current values
    lm.set_weights(initial)
    lm.compile(jit_compile=True)
    first = _fit(lm, epochs=EPOCHS // 2, callbacks=[keras.callbacks.ModelCheckpoint(str(path))])
    first_step = lm.train_function
    resumed = keras.saving.load_model(path)
    second = _fit(resumed, epochs=EPOCHS // 2)
    return first + second, first_step, resumed


@torch_only
@pytest.mark.slow
def test_compiled_fit_gives_eager_losses_and_weights(eager_run, compiled_run):
    _, eager_losses, eager_weights = eager_run
    losses, first_step, resumed = compiled_run
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for actual, expected in zip(_weights(resumed), eager_weights, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    # The compiled step ran every step (eager_steps would count Keras's train_step).
    assert (first_step.compiled_steps, first_step.eager_steps) == (EPOCHS // 2 * ROWS // BATCH, 0)


@torch_only
@pytest.mark.slow
def test_resumed_from_a_checkpoint_the_step_is_compiled_again(compiled_run):
    _, _, resumed = compiled_run
    assert resumed.get_compile_config()["jit_compile"] is True  # the user's choice came back from the file
    assert (resumed.train_function.compiled_steps, resumed.train_function.eager_steps) == (
        EPOCHS // 2 * ROWS // BATCH,
        0,
    )
    assert int(to_numpy(resumed.optimizer.iterations)) == EPOCHS * ROWS // BATCH


@torch_only
@pytest.mark.slow
def test_the_step_is_one_graph_and_never_recompiles(compiled_run):
    import torch

    _, first_step, resumed = compiled_run
    ((key, graph),) = first_step.graphs.items()  # one signature: every batch had the same shape
    x, y, w = _data()
    batch = keras.tree.map_structure(lambda a: torch.as_tensor(a[:BATCH]), (x, y, w))
    values = [v.value.detach().clone() for v in first_step._vars[0]]  # explain runs the graph
    explanation = torch._dynamo.explain(graph)(values, *batch)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    # Forward, backward and the optimizer in that one graph: AdamW's square root of the second moments.
    targets = {str(node.target) for node in graph.graph.nodes}
    assert any("sqrt" in t for t in targets) and any("mm" in t for t in targets)
    # Another epoch: Dynamo converts no new frame (a recompile would).
    frames = dict(torch._dynamo.utils.counters["frames"])
    _fit(resumed, epochs=1)
    assert dict(torch._dynamo.utils.counters["frames"]) == frames


@torch_only
@pytest.mark.slow
def test_compiled_lora_under_mixed_bfloat16_matches_eager():
    """Only the LoRA factors train (frozen kernels are inputs of the graph, not updated)."""
    runs, previous = [], keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("mixed_bfloat16")
        for jit_compile in (False, True):
            lm = _build()
            lm.backbone.enable_lora(2)
            frozen = [to_numpy(v) for v in lm.non_trainable_weights]
            lm.compile(jit_compile=jit_compile)
            runs.append((_fit(lm, epochs=EPOCHS), _weights(lm), lm))
            for before, after in zip(frozen, lm.non_trainable_weights, strict=True):
                np.testing.assert_array_equal(before, to_numpy(after))
    finally:
        keras.config.set_dtype_policy(previous)
    (eager_losses, eager_weights, _), (losses, weights, lm) = runs
    assert lm.train_function.compiled_steps == EPOCHS * ROWS // BATCH
    assert lm.backbone.compute_dtype == "bfloat16" and lm.backbone.variable_dtype == "float32"
    # bfloat16 products in a fused graph round differently from eager ones: bfloat16's own precision.
    np.testing.assert_allclose(losses, eager_losses, rtol=2e-2)
    for actual, expected in zip(weights, eager_weights, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=2e-2, atol=2e-3)
    assert not np.allclose(losses[0], losses[-1])  # it trained


@torch_only
@pytest.mark.slow
def test_compiled_dropout_draws_a_new_mask_every_step():
    """Dropout inside the graph: the same batch at learning rate 0 gives a different loss every step
    (a mask traced as a constant would repeat it), and the same sequence again after reseeding."""
    keras.utils.set_random_seed(0)
    backbone = kt.models.GPTBackbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=LENGTH,
        dropout=0.5,
    )
    lm = kt.models.GPTCausalLM(backbone)
    lm.compile(optimizer=keras.optimizers.AdamW(learning_rate=0.0), jit_compile=True)
    x, y, _ = _data()
    x = {name: np.tile(value[:BATCH], (ROWS // BATCH, 1)) for name, value in x.items()}  # one batch, 5 times
    y = np.tile(y[:BATCH], (ROWS // BATCH, 1))

    def step_losses():
        keras.utils.set_random_seed(7)
        recorder = _StepLosses()
        lm.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[recorder])
        running = np.array(recorder.losses)  # running means -> the loss of each step
        return running * np.arange(1, len(running) + 1) - np.concatenate(
            [[0.0], running[:-1] * np.arange(1, len(running))]
        )

    step_losses()  # compiles (compiling may draw from the global generator)
    first, second = step_losses(), step_losses()
    assert lm.train_function.compiled_steps == 3 * ROWS // BATCH and lm.train_function.eager_steps == 0
    assert len(np.unique(np.round(first, 5))) == len(first), first
    np.testing.assert_allclose(second, first, rtol=1e-5)


@torch_only
def test_a_variable_the_step_does_not_map_makes_the_model_train_eagerly(caplog):
    """A variable read by the model but tracked by no layer would be frozen into the graph at its traced
    value: the step refuses to compile it and trains eagerly, saying why (tensor constants are fine)."""
    hidden = keras.Variable(2.0, trainable=False)

    class Scale(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self._read = lambda: hidden  # a function attribute: Keras tracks no variable in it

        def call(self, x):
            return x * self._read() + keras.ops.convert_to_tensor(np.ones(3, "float32"))  # a tensor constant

    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(3)(Scale()(inputs)))
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    model.train_function = step = CompiledTrainStep(model)
    with caplog.at_level("WARNING", logger="keras_transformer"):
        model.fit(np.ones((8, 3), "float32"), np.zeros((8, 3), "float32"), batch_size=4, verbose=0)
    assert (step.compiled_steps, step.eager_steps) == (0, 2)
    assert "reads a variable" in step._eager_reason and "runs eagerly" in caplog.text


@torch_only
def test_auto_switches_from_eager_to_compiled_within_one_fit(monkeypatch):
    """`jit_compile="auto"` trains eagerly until its eager steps (the first excluded: it builds the optimizer)
    have taken `COMPILE_AFTER_SECONDS`, then compiles the step and runs it compiled, within the same `fit`. The
    threshold is set to the smallest time here, so the switch comes at a known step on any machine: the third
    (the second is the one timed eager step). The losses and weights are those of an all-eager run.

    Fast: a one-layer model, and Dynamo's "eager" backend (the library's own switch, read when the step compiles)
    runs the traced step graph without generating code; the inductor-compiled step is checked against eager
    above (slow tests)."""
    import torch

    def build():
        keras.utils.set_random_seed(0)
        backbone = kt.models.GPTBackbone(
            vocabulary_size=VOCAB,
            num_layers=1,
            num_heads=1,
            hidden_dim=8,
            intermediate_dim=16,
            max_sequence_length=LENGTH,
            dropout=0.0,
        )
        return kt.models.GPTCausalLM(backbone)

    eager = build()
    eager.compile(jit_compile=False)
    eager_losses = _fit(eager, epochs=2)
    monkeypatch.setattr(compiled_step, "COMPILE_AFTER_SECONDS", 1e-9)
    monkeypatch.setenv("KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND", "eager")
    lm = build()
    lm.compile()  # jit_compile="auto"
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    losses = _fit(lm, epochs=2)  # one run: 10 steps
    step = lm.train_function
    assert isinstance(step, CompiledTrainStep) and step.warmup_seconds == 1e-9
    assert (step.eager_steps, step.compiled_steps) == (2, 2 * ROWS // BATCH - 2)
    assert len(step.graphs) == 1  # the traced step, one batch shape
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1  # which Dynamo compiled
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for actual, expected in zip(_weights(lm), _weights(eager), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
