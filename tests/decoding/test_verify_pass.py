"""The verify pass: a family's one cached step run on T > 1 tokens after a filled cache (cache_index > 0), as
speculative decoding checks its K drafts, against the full forward pass; and rollback by moving the write
position only (stale keys past it stay in the cache, masked out, never copied away).

Axes: B batch, N sequence length, T new tokens, V vocabulary.

Runtimes: the Keras layers on every backend; on PyTorch also the layer kernels, eager (an int index, the
written positions read) and static (a compiled step's: a tensor index, the whole cache read under a mask).
"""

import keras
import numpy as np
import pytest

from tests.conftest import to_numpy
from tests.kernels.test_torch_kernels import MODELS, VOCABULARY

FAMILIES = {
    "gpt": MODELS["gpt"],
    "llama": MODELS["llama_gqa_tied"],
    "llama_window": MODELS["llama_untied_window_partial"],  # a window of 3, shorter than the verify pass
    "t5": MODELS["t5_tied_relu"],
}
RUNTIMES = ["keras"] + (["torch_eager", "torch_static"] if keras.config.backend() == "torch" else [])
BATCH, LENGTH = 2, 12


@pytest.fixture(scope="module")
def tasks():
    keras.utils.set_random_seed(5)
    return {name: build() for name, build in FAMILIES.items()}


def _source(task, rng):
    """T5's encoder inputs (padded sources) and what its step reads of them; () for a decoder-only model."""
    if not hasattr(task, "compute_cross_cache"):
        return None, ()
    source = rng.integers(1, VOCABULARY, (BATCH, 7)).astype("int32")
    mask = np.arange(7)[None, :] < np.array([[7], [4]])
    return (source, mask), (task.compute_cross_cache(task.encode(source, mask)), mask)


def _full_logits(task, ids, source):
    """The full forward pass's logits (B, N, V) of `ids` (B, N)."""
    if source is None:
        return to_numpy(task({"token_ids": ids, "padding_mask": np.ones(ids.shape, bool)}))
    inputs = {
        "encoder_token_ids": source[0],
        "encoder_padding_mask": source[1],
        "decoder_token_ids": ids,
        "decoder_padding_mask": np.ones(ids.shape, bool),
    }
    return to_numpy(task(inputs))


class _Stepper:
    """One runtime's cached step: (B, T) ids at `index` -> logits (B, T, V) numpy, the cache kept inside."""

    def __init__(self, task, runtime, step_args):
        self.task, self.runtime = task, runtime
        shape = task.backbone.cache_shape(BATCH, LENGTH)  # (B, L, 2, Hkv, S, Dh)
        if runtime == "keras":
            self.cache, self.args, self.kernels = keras.ops.zeros(shape), step_args, None
            return
        import torch

        from keras_transformer.kernels import torch_kernels

        _, layers, _, heads, _, head_dim = shape
        self.cache = [tuple(torch.zeros((BATCH, heads, LENGTH, head_dim)) for _ in range(2)) for _ in range(layers)]
        self.args = ()
        if step_args:
            cross, mask = step_args
            self.args = ([(cross[:, i, 0], cross[:, i, 1]) for i in range(cross.shape[1])], torch.as_tensor(mask))
        self.kernels = torch_kernels.TorchKernels(length=LENGTH if runtime == "torch_static" else None)

    def __call__(self, ids, index):
        if self.kernels is None:
            logits, self.cache = self.task.call_with_cache(ids, self.cache, index, *self.args)
            return to_numpy(logits)
        import torch

        with torch.no_grad():
            logits, self.cache = self.task.call_with_cache(
                torch.as_tensor(ids), self.cache, torch.tensor(index, dtype=torch.int32), *self.args,
                call_layer=self.kernels,
            )  # fmt: skip
        return to_numpy(logits)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_multi_token_step_after_a_filled_cache_equals_the_full_forward_pass(tasks, family, runtime):
    """Prefill 5, verify 4 at index 5; roll back to 7 (one draft accepted) and verify 4 other tokens over the
    stale keys at 7 and 8; roll back to 6 and verify 2 with stale keys at 8..10 left past the queries. Each
    pass's logits equal the full forward pass of the sequence it stands for."""
    task = tasks[family]
    rng = np.random.default_rng(11)
    source, step_args = _source(task, rng)
    ids = rng.integers(1, VOCABULARY, (BATCH, LENGTH)).astype("int32")
    step = _Stepper(task, runtime, step_args)
    step(ids[:, :5], 0)
    passes = [(5, 4, ids)]
    other = ids.copy()
    other[:, 7:] = (ids[:, 7:] + 1 + rng.integers(0, VOCABULARY - 1, (BATCH, LENGTH - 7))) % VOCABULARY
    passes.append((7, 4, other))
    third = other.copy()
    third[:, 6:] = (other[:, 6:] + 3) % VOCABULARY
    passes.append((6, 2, third))
    for index, width, sequence in passes:
        logits = step(sequence[:, index : index + width], index)  # (B, T, V)
        expected = _full_logits(task, sequence, source)[:, index : index + width]
        assert np.abs(expected).max() > 1e-3  # the models are not degenerate: a wrong mask shows
        np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=0, err_msg=f"{family}: T={width} at {index}")
