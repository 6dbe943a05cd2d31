"""ModernBERT family: config round trips, the local window and the first layer's missing norm, bad arguments.

Numerical parity with Hugging Face ModernBertForMaskedLM (logits with and without padding, the tokenizer, the ONNX
bundle and the SavedModel, the export back, `fit`, the modernbert_base preset) is in
tests/convert/test_hf_modernbert.py.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.models.modernbert import ModernBertEncoderBlock
from keras_transformer.models.modernbert.modernbert_backbone import default_layer_types
from tests.conftest import to_numpy

LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention"]


def _tiny(**kwargs):
    config = dict(
        vocabulary_size=40,
        num_layers=3,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        max_sequence_length=32,
        layer_types=LAYER_TYPES,
        local_attention=4,
        local_rope_max_wavelength=100.0,
        initializer_range=0.3,
    )
    return kt.models.ModernBertBackbone(**{**config, **kwargs})


def _inputs(length=9):
    token_ids = np.random.default_rng(0).integers(1, 40, size=(2, length)).astype("int32")
    padding_mask = np.ones((2, length), bool)
    padding_mask[1, length - 3 :] = False
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def test_config_round_trip_gives_the_same_outputs():
    backbone = _tiny()
    lm = kt.models.ModernBertMaskedLM(backbone)
    again = kt.models.ModernBertMaskedLM.from_config(lm.get_config())
    assert again.get_config() == lm.get_config()
    assert again.backbone.layer_types == LAYER_TYPES
    again.set_weights(lm.get_weights())
    x = {**_inputs(), "mask_positions": np.array([[1, 4], [0, 2]], "int32")}
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(lm(x)))
    block = backbone.transformer_layers[1]
    assert ModernBertEncoderBlock.from_config(block.get_config()).get_config() == block.get_config()


def test_layers_follow_their_types():
    """Global layers see every token with the global base; local ones a window of local_attention // 2 each side
    with the local base; the first layer has no attention norm (its input is the embeddings' norm)."""
    backbone = _tiny()
    blocks = backbone.transformer_layers
    assert [b.local_window for b in blocks] == [None, 2, 2]
    assert [b.rope_max_wavelength for b in blocks] == [160000.0, 100.0, 100.0]
    assert blocks[0].self_attention_norm is None and blocks[1].self_attention_norm is not None
    assert not any("beta" in w.path or "bias" in w.path for w in backbone.weights)  # no biases anywhere
    expected = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]  # every third global
    assert default_layer_types(4) == expected


@pytest.mark.parametrize("local_window, reaches", [(2, False), (None, True)])
def test_a_local_layer_sees_only_its_window(local_window, reaches):
    """Changing token 5 changes a local layer's output at position 2 only when 5 is in the window (|5 - 2| > 2)."""
    block = ModernBertEncoderBlock(num_heads=2, intermediate_dim=24, local_window=local_window)
    x = keras.random.normal((1, 8, 16), seed=0)
    # A new direction at position 5 (a constant shift would vanish in the layer's norm).
    changed = keras.ops.concatenate([x[:, :5], x[:, 5:6] + keras.random.normal((1, 1, 16), seed=1), x[:, 6:]], axis=1)
    before, after = to_numpy(block(x)), to_numpy(block(changed))
    assert (np.abs(before[0, 2] - after[0, 2]).max() > 1e-3) == reaches
    assert np.abs(before[0, 4] - after[0, 4]).max() > 1e-3  # a neighbour of 5 sees it either way


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="layer_types"):
        _tiny(layer_types=["full_attention"])
    with pytest.raises(ValueError, match="local_attention=0"):
        _tiny(local_attention=0)
    with pytest.raises(ValueError, match="local_window=-1"):
        ModernBertEncoderBlock(num_heads=2, intermediate_dim=8, local_window=-1)
    with pytest.raises(ValueError, match="activation='gelu'"):
        ModernBertEncoderBlock(num_heads=2, intermediate_dim=8, activation="gelu")
