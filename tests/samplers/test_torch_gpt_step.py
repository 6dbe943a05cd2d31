"""The plain-PyTorch GPT decoding step (samplers/torch_gpt_step.py) against the Keras model.

On PyTorch `generate` runs GPT through that step; these tests hold its logits and caches to
`GPTCausalLM.call_with_cache` (prefill, then one token per step, grouped-query attention
included) and check it is used exactly where it is meant to be: PyTorch, float32 GPT.
"""

import keras
import numpy as np
import pytest

from keras_transformer.models import GPTBackbone, GPTCausalLM
from keras_transformer.samplers import torch_gpt_step
from tests.conftest import to_numpy

ATOL = 1e-5


def _lm(**kwargs):
    keras.utils.set_random_seed(3)
    config = dict(vocabulary_size=37, num_layers=2, num_heads=4, hidden_dim=16, intermediate_dim=24,
                  max_sequence_length=32)
    return GPTCausalLM(GPTBackbone(**{**config, **kwargs}))


def test_used_only_for_float32_gpt_on_pytorch():
    on_torch = keras.config.backend() == "torch"
    assert torch_gpt_step.supports(_lm()) is on_torch
    assert not torch_gpt_step.supports(_lm(dtype="mixed_float16"))
    assert not torch_gpt_step.supports(_lm(dtype="bfloat16"))


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_logits_and_caches_match_keras(kv_heads):
    import torch

    lm = _lm(num_key_value_heads=kv_heads)
    if keras.config.backend() != "torch":
        # Elsewhere the Keras step is the only one: generate never takes this path.
        assert not torch_gpt_step.supports(lm)
        return
    rng = np.random.default_rng(0)
    batch, length, prefill = 3, 12, 5
    ids = rng.integers(0, 37, (batch, length)).astype("int32")
    shape = lm.backbone.cache_shape(batch, length)
    keras_cache = np.zeros(shape, "float32")
    _, layers, _, kv, _, head_dim = shape
    torch_cache = [(torch.zeros((batch, kv, length, head_dim)), torch.zeros((batch, kv, length, head_dim))) for _ in range(layers)]
    start = 0
    with torch.no_grad():
        for width in [prefill] + [1] * (length - prefill):
            chunk = ids[:, start : start + width]
            expected, keras_cache = lm.call_with_cache(chunk, keras_cache, start)
            logits, torch_cache = torch_gpt_step.call_with_cache(
                lm, torch.as_tensor(chunk), torch_cache, torch.tensor(start, dtype=torch.int32)
            )
            np.testing.assert_allclose(to_numpy(logits), to_numpy(expected), atol=ATOL, rtol=0,
                                       err_msg=f"positions {start}..{start + width - 1}")
            start += width
    # L x 2 x (B, Hkv, S, Dh) -> (B, L, 2, Hkv, S, Dh)
    stacked = np.stack([np.stack([to_numpy(k), to_numpy(v)], axis=1) for k, v in torch_cache], axis=1)
    np.testing.assert_allclose(stacked, to_numpy(keras_cache), atol=ATOL, rtol=0)
