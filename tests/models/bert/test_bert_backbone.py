"""BertBackbone: shapes, masking and segment invariants, argument checks, config / .keras / preset round trips.

(Numerical parity with Hugging Face BertModel is in test_bert_parity.py.)

Axes: B batch, T sequence length, D width.
"""

import keras
import numpy as np
import pytest

from keras_transformer.models import Backbone, BertBackbone
from tests.conftest import to_numpy


def _inputs(rng, vocabulary_size, length=16):
    # (B, T) = (2, 16), the shape every BERT test uses (JAX compiles each new shape once).
    positions = np.arange(length)[None, :]
    return {
        "token_ids": rng.integers(5, vocabulary_size, (2, length)).astype("int32"),
        "segment_ids": np.stack([positions[0] >= 6, positions[0] < 0]).astype("int32"),  # row 0: two segments
        "padding_mask": positions < np.array([[length], [4]]),  # row 1: 4 real tokens, then padding
    }


def _outputs(model, inputs):
    outputs = model(inputs)
    return to_numpy(outputs["sequence_output"]), to_numpy(outputs["pooled_output"])


def test_shapes_names_and_family(tiny_backbone, rng):
    backbone = tiny_backbone()
    sequence, pooled = _outputs(backbone, _inputs(rng, backbone.vocabulary_size))
    assert sequence.shape == (2, 16, 16) and pooled.shape == (2, 16)
    assert BertBackbone.family == "bert"
    names = {layer.name for layer in backbone.layers}
    assert {
        "token_embedding",
        "segment_embedding",
        "position_embedding",
        "embeddings_layer_norm",
        "transformer_layer_0",
        "pooled_dense",
    } <= names
    assert isinstance(backbone.token_embedding, keras.layers.ReversibleEmbedding)


def test_pooled_output_is_tanh_dense_of_the_first_token(tiny_backbone, rng):
    backbone = tiny_backbone()
    sequence, pooled = _outputs(backbone, _inputs(rng, backbone.vocabulary_size))
    kernel, bias = (to_numpy(w) for w in backbone.pooled_dense.weights)
    np.testing.assert_allclose(pooled, np.tanh(sequence[:, 0] @ kernel + bias), atol=1e-5)


def test_padded_tokens_do_not_change_real_positions(tiny_backbone, rng):
    backbone = tiny_backbone()
    inputs = _inputs(rng, backbone.vocabulary_size)
    other = {**inputs, "token_ids": inputs["token_ids"].copy(), "segment_ids": inputs["segment_ids"].copy()}
    other["token_ids"][1, 4:] = rng.integers(5, backbone.vocabulary_size, 12)
    other["segment_ids"][1, 4:] = 1
    sequence, pooled = _outputs(backbone, inputs)
    sequence_other, pooled_other = _outputs(backbone, other)
    np.testing.assert_allclose(sequence_other[1, :4], sequence[1, :4], atol=1e-5)
    np.testing.assert_allclose(pooled_other, pooled, atol=1e-5)
    # ...while the unmasked model does see them.
    unmasked = {**other, "padding_mask": np.ones_like(inputs["padding_mask"])}
    assert np.max(np.abs(_outputs(backbone, unmasked)[0][1, :4] - sequence[1, :4])) > 1e-3


def test_segment_ids_change_the_output(tiny_backbone, rng):
    backbone = tiny_backbone()
    inputs = _inputs(rng, backbone.vocabulary_size)
    sequence, _ = _outputs(backbone, inputs)
    flipped, _ = _outputs(backbone, {**inputs, "segment_ids": 1 - inputs["segment_ids"]})
    assert np.max(np.abs(flipped[0] - sequence[0])) > 1e-3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocabulary_size=0), "vocabulary_size=0"),
        (dict(num_layers=1.5), "num_layers=1.5"),
        (dict(num_heads=3), "multiple of `num_heads`"),
        (dict(num_segments=-1), "num_segments=-1"),  # 0 is DistilBERT's: no segment embedding
        (dict(max_sequence_length=-1), "max_sequence_length=-1"),
        (dict(dropout=1.0), "dropout=1.0"),
        (dict(initializer_range=0), "initializer_range=0"),
        (dict(activation="swish"), "activation"),
    ],
)
def test_invalid_arguments(tiny_backbone, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny_backbone(**kwargs)


def test_positions_past_max_sequence_length_are_an_error(tiny_backbone):
    backbone = tiny_backbone()
    ids = np.ones((2, 33), "int32")
    with pytest.raises(ValueError, match="max_sequence_length=32"):
        backbone({"token_ids": ids, "segment_ids": ids * 0, "padding_mask": ids.astype(bool)})


def test_config_round_trip(tiny_backbone, rng):
    # Non-default values that keep the weight shapes of the other tests.
    options = dict(norm_epsilon=1e-6, activation="relu", dropout=0.2, initializer_range=0.05, num_segments=2)
    backbone = tiny_backbone(**options)
    config = backbone.get_config()
    restored = BertBackbone.from_config(config)
    assert restored.get_config() == config
    for key, value in options.items():
        assert config[key] == value
    restored.set_weights(backbone.get_weights())
    inputs = _inputs(rng, backbone.vocabulary_size)
    for a, b in zip(_outputs(backbone, inputs), _outputs(restored, inputs)):
        np.testing.assert_array_equal(a, b)


def test_keras_file_round_trip(tiny_backbone, rng, tmp_path):
    backbone = tiny_backbone()
    path = tmp_path / "bert.keras"
    backbone.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, BertBackbone)
    inputs = _inputs(rng, backbone.vocabulary_size)
    for a, b in zip(_outputs(backbone, inputs), _outputs(restored, inputs)):
        np.testing.assert_array_equal(a, b)


def test_preset_round_trip(tiny_backbone, rng, tmp_path):
    backbone = tiny_backbone()
    backbone.save_to_preset(tmp_path / "preset")
    inputs = _inputs(rng, backbone.vocabulary_size)
    for restored in (BertBackbone.from_preset(tmp_path / "preset"), Backbone.from_preset(tmp_path / "preset")):
        assert isinstance(restored, BertBackbone)
        for a, b in zip(_outputs(backbone, inputs), _outputs(restored, inputs)):
            np.testing.assert_array_equal(a, b)
    fresh = BertBackbone.from_preset(tmp_path / "preset", load_weights=False)
    assert not np.allclose(_outputs(fresh, inputs)[0], _outputs(backbone, inputs)[0])
