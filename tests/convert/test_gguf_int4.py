"""The answer in benchmarks/RESULTS.md ("GGUF"), checked: a Q4_0 tensor is exactly a Keras int4 Dense kernel with
32-wide blocks (Keras 3.15's sub-channel int4: per block and output a float32 scale and an int8 zero point,
w = scale * (q - zero) with q in [-8, 7]), taking the block's float16 scale d and the zero point 0, since Q4_0 stores
w = d * (nibble - 8). Two references, neither ours: gguf's quantizer / dequantizer and Keras's int4 layer.

Axes: O outputs, I inputs, G blocks of 32 inputs.
"""

import gguf
import keras
import numpy as np
from keras import quantizers

from tests.conftest import to_numpy

O, I, BLOCK = 48, 64, 32


def test_q4_0_is_keras_int4_with_32_wide_blocks():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(O, I)).astype("float32")  # (O, I): a GGUF row holds one output's inputs
    blocks = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q4_0)  # (O, G * 18) bytes: f16 d, 16 nibbles
    reference = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_0)  # (O, I)
    scale = blocks.reshape(O, I // BLOCK, 18)[:, :, :2].copy().view("<f2")[..., 0].astype("float32")  # (O, G)
    q = np.rint(reference / np.repeat(scale, BLOCK, axis=1)).astype("int8")  # (O, I), nibble - 8
    assert q.min() >= -8 and q.max() <= 7

    layer = keras.layers.Dense(O, use_bias=False)
    layer.build((None, I))
    layer.quantize("int4", config=quantizers.Int4QuantizationConfig(block_size=BLOCK))
    packed, _, _ = quantizers.pack_int4(q.T, axis=-1)  # (I, O) -> (I, O / 2)
    layer._kernel.assign(packed)
    layer.kernel_scale.assign(scale.T)  # (G, O)
    layer.kernel_zero.assign(np.zeros((I // BLOCK, O), "int8"))
    kernel = to_numpy(layer(np.eye(I, dtype="float32")))  # (I, O): each input alone reads its kernel row
    np.testing.assert_array_equal(kernel, reference.T)
    assert np.abs(kernel - weights.T).max() > 0  # a 4-bit kernel, not the float one
