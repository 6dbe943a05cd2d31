"""Writes the golden files of the block tests: weights (.weights.h5), inputs and the outputs that
the numpy reference (tests/reference.py) computes from those weights. The layers only store the
weights here; they never produce the expected outputs.

Run from the repository root, under any backend (the files must load on all three):
    KERAS_BACKEND=tensorflow .venv/bin/python tests/layers/golden/make_golden.py
Rerun only when a block's weight layout changes on purpose (that breaks saved checkpoints).
"""

import json
import os
import sys

import keras
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

from keras_transformer.layers import TransformerDecoderBlock, TransformerEncoderBlock  # noqa: E402
from tests import reference  # noqa: E402
from tests.layers.helpers import GOLDEN_DIR, block_weights, randomize_weights  # noqa: E402

B, T, S_ENC, D = 2, 5, 4, 8

ENCODER_CONFIG = dict(num_heads=2, intermediate_dim=16, activation="gelu", norm_type="layer_norm", norm_first=False)
DECODER_CONFIG = dict(
    num_heads=2,
    intermediate_dim=16,
    activation="silu",
    norm_type="rms_norm",
    norm_first=True,
    num_key_value_heads=1,
    use_cross_attention=True,
)


def _write(name, block, config, inputs, call_kwargs, expected):
    keras.saving.save_weights(block, os.path.join(GOLDEN_DIR, f"{name}.weights.h5"))
    arrays = {
        "config": np.array(json.dumps(config)),
        "inputs": inputs,
        "expected": expected,
        **{f"call/{k}": v for k, v in call_kwargs.items()},
    }
    for sublayer, weights in block_weights(block).items():
        arrays.update({f"weights/{sublayer}/{k}": v for k, v in weights.items()})
    np.savez_compressed(os.path.join(GOLDEN_DIR, f"{name}.npz"), **arrays)


def main():
    rng = np.random.default_rng(20240601)
    x = rng.standard_normal((B, T, D)).astype("float32")
    padding_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")

    encoder = TransformerEncoderBlock(**ENCODER_CONFIG)
    encoder(x)
    randomize_weights(encoder, rng)
    expected = reference.encoder_block(
        block_weights(encoder), x, activation="gelu", norm_type="layer_norm", norm_first=False,
        padding_mask=padding_mask,
    )  # fmt: skip
    _write("encoder_block", encoder, ENCODER_CONFIG, x, {"padding_mask": padding_mask}, expected)

    encoder_outputs = rng.standard_normal((B, S_ENC, D)).astype("float32")
    encoder_padding_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], "int32")
    decoder = TransformerDecoderBlock(**DECODER_CONFIG)
    decoder(x, encoder_outputs)
    randomize_weights(decoder, rng)
    call_kwargs = dict(
        encoder_outputs=encoder_outputs, padding_mask=padding_mask, encoder_padding_mask=encoder_padding_mask
    )
    expected = reference.decoder_block(
        block_weights(decoder), x, activation="silu", norm_type="rms_norm", norm_first=True, **call_kwargs
    )
    _write("decoder_block", decoder, DECODER_CONFIG, x, call_kwargs, expected)
    print("wrote", sorted(os.listdir(GOLDEN_DIR)))


if __name__ == "__main__":
    main()
