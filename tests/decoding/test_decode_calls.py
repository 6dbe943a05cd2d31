"""Decoding across calls: compiled functions and PyTorch's kernels are kept from one `generate` call to the
next, and still follow the model's weights when they change in between.

On PyTorch the kernels' arranged weights (fused projections, 16-bit copies) are made once and refreshed in
place, so a compiled step keeps reading the same tensors (no recompilation, no new CUDA graph capture);
the compiled prefill and step compile once and are never compiled again on later calls.
"""

import keras
import numpy as np
import pytest

from keras_transformer.decoding import compile as compile_lib
from keras_transformer.samplers import BeamSampler
from tests.kernels.test_torch_kernels import _gpt, _llama, _t5

FAMILIES = {"gpt": _gpt, "llama": _llama, "t5": _t5}
torch_only = pytest.mark.skipif(keras.config.backend() != "torch", reason="the PyTorch kernels and torch.compile")


def _inputs():
    rng = np.random.default_rng(3)
    return [list(rng.integers(1, 37, 5)), list(rng.integers(1, 37, 3))]  # ragged prompts, or sources


def _generate(task, sampler="greedy"):
    return [
        np.asarray(x).tolist() for x in task.generate(_inputs(), max_new_tokens=7, sampler=sampler, stop_token_ids=None)
    ]


def _other_weights(task, seed):
    rng = np.random.default_rng(seed)
    return [w + rng.normal(0.0, 0.5, w.shape).astype(w.dtype) if w.dtype.kind == "f" else w for w in task.get_weights()]


# On PyTorch: eager kernels for every family, and the compiled step for the family whose arranged weights are
# copies (Llama's fused projections); elsewhere the backend's one compiled loop.
CASES = (
    [(family, "eager") for family in sorted(FAMILIES)] + [("llama", "compiled")]
    if keras.config.backend() == "torch"
    else [(family, "default") for family in sorted(FAMILIES)]
)


@pytest.mark.parametrize("family,mode", CASES)
def test_a_call_after_new_weights_decodes_with_them(family, mode, monkeypatch):
    """generate, set_weights, generate: the second call equals a fresh model built with the new weights
    (greedy, and beam-4 for Llama). On PyTorch, eager kernels and a compiled step (torch.compile's "eager" backend)."""
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "1" if mode == "compiled" else "0")
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_BACKEND_ENV, "eager")
    samplers = ["greedy"] + ([BeamSampler(num_beams=4)] if family == "llama" else [])
    keras.utils.set_random_seed(1)
    task = FAMILIES[family]()
    before = [_generate(task, sampler) for sampler in samplers]
    new_weights = _other_weights(task, seed=7)
    task.set_weights(new_weights)
    after = [_generate(task, sampler) for sampler in samplers]
    keras.utils.set_random_seed(2)
    fresh = FAMILIES[family]()
    fresh.set_weights(new_weights)
    assert after == [_generate(fresh, sampler) for sampler in samplers]
    assert after != before  # the new weights change the tokens: the test can tell stale weights apart


@torch_only
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_prefill_and_step_compile_once_across_calls(family, monkeypatch):
    """Three calls of the same shapes: graphs are compiled in the first two (each function's first call runs
    eagerly), none in the third, no recompilation and no graph break; the prefill is compiled for a
    decoder-only model (a seq2seq encoder runs through Keras, eagerly)."""
    import torch._dynamo

    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "1")
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_BACKEND_ENV, "eager")
    keras.utils.set_random_seed(1)
    task = FAMILIES[family]()
    torch._dynamo.reset()
    graphs = []
    for _ in range(3):
        torch._dynamo.utils.counters.clear()
        _generate(task)
        counters = torch._dynamo.utils.counters
        assert not counters["graph_break"] and not counters["recompiles"], dict(counters)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[2] == 0 and sum(graphs) >= 1, graphs
    prefills = [key for key in compile_lib.compiled_cache(task).functions if key[0] == "prepare"]
    assert len(prefills) == 1 and (len(prefills[0]) > 1) == (family != "t5"), prefills  # shapes in the key


@torch_only
def test_kernels_keep_their_weight_tensors_and_mark_them_static(monkeypatch):
    """The arranged weights are the same tensors call after call, refreshed in place after training, and
    marked as static inputs (CUDA graphs read them in place rather than copying them at every replay)."""
    import torch

    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "0")
    keras.utils.set_random_seed(1)
    task = _llama()  # fused q/k/v and gate/up: arranged weights that are copies, not views of the variables
    _generate(task)
    ((kernels, _),) = compile_lib.compiled_cache(task).kernels.values()
    tensors = [
        t for w in kernels._weights.values() for t in torch.utils._pytree.tree_leaves(w) if isinstance(t, torch.Tensor)
    ]
    assert tensors and all(getattr(t, "_dynamo_static_input_type", None) for t in tensors)
    copies = {id(t): t.clone() for t in tensors}
    task.set_weights(_other_weights(task, seed=8))
    _generate(task)
    ((again, _),) = compile_lib.compiled_cache(task).kernels.values()
    assert again is kernels
    now = [
        t for w in kernels._weights.values() for t in torch.utils._pytree.tree_leaves(w) if isinstance(t, torch.Tensor)
    ]
    assert [id(t) for t in now] == [id(t) for t in tensors]
    assert any(not torch.equal(t, copies[id(t)]) for t in now)  # refreshed in place
