"""A backbone built with a non-default dtype policy keeps it through get_config / from_config."""

import keras
import numpy as np
import pytest

from keras_transformer.models import BertBackbone, GPTBackbone, T5Backbone, TransformerBackbone
from tests.conftest import to_numpy

SMALL = {"vocabulary_size": 50, "num_layers": 1, "num_heads": 2, "hidden_dim": 8, "intermediate_dim": 16}
FAMILIES = {
    "gpt": (GPTBackbone, {"max_sequence_length": 8}),
    "bert": (BertBackbone, {"max_sequence_length": 8}),
    "t5": (T5Backbone, {}),
    "transformer": (TransformerBackbone, {"max_sequence_length": 8}),
}


def _inputs(backbone):
    ids, mask = np.ones((1, 4), "int32"), np.ones((1, 4), bool)
    if isinstance(backbone, GPTBackbone):
        return {"token_ids": ids, "padding_mask": mask}
    if isinstance(backbone, BertBackbone):
        return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
    return {
        "encoder_token_ids": ids,
        "encoder_padding_mask": mask,
        "decoder_token_ids": ids,
        "decoder_padding_mask": mask,
    }


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_dtype_survives_config_round_trip(family, dtype):
    cls, extra = FAMILIES[family]
    backbone = cls(**SMALL, **extra, dtype=dtype)
    config = backbone.get_config()
    assert keras.dtype_policies.deserialize(config["dtype"]).name == dtype
    rebuilt = cls.from_config(config)
    policy = keras.dtype_policies.get(dtype)
    for layer in rebuilt.layers[1:]:
        if layer.weights:
            assert layer.dtype_policy.name == dtype, layer.name
            assert all(w.dtype == policy.variable_dtype for w in layer.weights), layer.name
    out = rebuilt(_inputs(rebuilt))
    first = next(iter(out.values())) if isinstance(out, dict) else out
    assert keras.backend.standardize_dtype(first.dtype) == policy.compute_dtype
    assert np.all(np.isfinite(to_numpy(first).astype("float32")))
