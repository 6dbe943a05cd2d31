"""PyTorch's compiled decoding step (decoding/compile.py): one graph per step for every family, the same
tokens as the eager step, and 16-bit, int8 and int4 models on the kernels' fast path.

The compiled steps here use `torch.compile(backend="eager")` (`KERAS_TRANSFORMER_TORCH_COMPILE_BACKEND`):
Dynamo captures the whole step as one graph (`fullgraph=True`: a graph break raises) and runs it op by
op, so no code is generated and the suite stays fast; one slow test runs the real inductor path.
"""

import keras
import numpy as np
import pytest

from keras_transformer.decoding import compile as compile_lib
from keras_transformer.kernels import torch_kernels
from keras_transformer.samplers import BeamSampler, GreedySampler, RandomSampler
from tests.kernels.test_torch_kernels import _gpt, _llama, _t5, _transformer

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "torch", reason="torch.compile and the PyTorch kernels exist on the PyTorch backend only"
)

FAMILIES = {"gpt": _gpt, "t5": _t5, "llama": _llama, "transformer": _transformer}
SAMPLERS = {
    "greedy": GreedySampler,
    "beam4": lambda: BeamSampler(num_beams=4),
    "random": lambda: RandomSampler(top_k=8, temperature=0.9, seed=11),
}


def _build(family, dtype="float32"):
    keras.utils.set_random_seed(5)
    reference = FAMILIES[family]()
    if dtype == "float32":
        return reference
    if dtype in ("int8", "int4", "int4_lora"):
        reference.quantize(dtype.removesuffix("_lora"))
        if dtype.endswith("_lora"):
            reference.backbone.enable_lora(2)  # QLoRA; B starts at zero, so the tokens are the int4 model's
        return reference
    if family == "transformer":
        raise ValueError("the transformer builder takes no dtype")
    task = FAMILIES[family](dtype=dtype)
    task.backbone.set_weights(reference.backbone.get_weights())
    return task


def _generate(task, sampler, monkeypatch, mode):
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "1" if mode == "compiled" else "0")
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_BACKEND_ENV, "eager")
    rng = np.random.default_rng(2)
    inputs = [list(rng.integers(1, 37, 5)), list(rng.integers(1, 37, 3))]  # ragged prompts, or sources
    out = task.generate(inputs, max_new_tokens=9, sampler=sampler, stop_token_ids=None)
    return [np.asarray(x).tolist() for x in out]


def _compiled_steps(task):
    return [f for key, f in compile_lib.compiled_cache(task).functions.items() if key[0] == "step"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_compiled_step_is_one_graph_and_equals_eager(family, sampler, monkeypatch):
    import torch._dynamo

    task = _build(family)
    eager = _generate(task, SAMPLERS[sampler](), monkeypatch, "eager")
    assert _compiled_steps(task) == []  # the eager loop compiles no step
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = _generate(task, SAMPLERS[sampler](), monkeypatch, "compiled")
    assert compiled == eager
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] >= 1, "no step was compiled"
    assert not counters["graph_break"], dict(counters["graph_break"])  # fullgraph=True also raises on one
    assert len(_compiled_steps(task)) == 1


@pytest.mark.parametrize("family", ["gpt", "t5", "llama"])
@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16", "int8", "int4", "int4_lora"])
def test_16_bit_and_int8_models_decode_on_the_kernels(family, dtype, monkeypatch):
    """The fast path is taken (every layer through a kernel), eager and compiled agree, and the tokens
    follow the float32 model's at first (16-bit, 8-bit or 4-bit rounding may part them later)."""
    made = []
    original = torch_kernels.TorchKernels.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(torch_kernels.TorchKernels, "__init__", spy)
    task = _build(family, dtype)
    eager = _generate(task, GreedySampler(), monkeypatch, "eager")
    compiled = _generate(task, BeamSampler(num_beams=2), monkeypatch, "compiled")
    assert len(made) == 2 and [k.static for k in made] == [False, True]
    assert all(k._weights and not k.through_keras for k in made), [k.through_keras for k in made]
    assert _generate(task, GreedySampler(), monkeypatch, "compiled") == eager
    assert len(compiled) == 2
    reference = _generate(_build(family), GreedySampler(), monkeypatch, "eager")
    start = 1 if family == "t5" else 5  # the first generated token: after the decoder's start token / the prompt
    assert [row[start] for row in eager] == [row[start] for row in reference], (eager, reference)


@pytest.mark.slow
def test_inductor_compiled_step_end_to_end(monkeypatch):
    """The real compiled path (inductor generates the step's code) gives the eager tokens."""
    task = _build("llama")
    eager = _generate(task, GreedySampler(), monkeypatch, "eager")
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "1")
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_BACKEND_ENV, "inductor")
    rng = np.random.default_rng(2)
    inputs = [list(rng.integers(1, 37, 5)), list(rng.integers(1, 37, 3))]
    compiled = [np.asarray(x).tolist() for x in task.generate(inputs, max_new_tokens=9, stop_token_ids=None)]
    assert compiled == eager


def test_compile_choice_is_validated(monkeypatch):
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "sometimes")
    with pytest.raises(ValueError, match="KERAS_TRANSFORMER_TORCH_COMPILE"):
        compile_lib.torch_step_mode(_gpt())
