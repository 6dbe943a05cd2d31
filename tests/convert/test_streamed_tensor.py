"""StreamedTensor and host_view (convert/streamed_tensor.py): a checkpoint tensor read from our weight a block at a
time, in the weight's order or transposed, equal to the weight; on the CPU the blocks are cut from the weight's own
memory, with no backend operation per block."""

import keras
import ml_dtypes
import numpy as np
import pytest

from keras_transformer.convert import streamed_tensor
from keras_transformer.convert.streamed_tensor import StreamedTensor, host_view


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_host_view_is_the_variables_memory(dtype):
    values = np.random.default_rng(0).normal(size=(6, 5)).astype("float32")
    variable = keras.Variable(values, dtype=dtype)
    first, second = host_view(variable), host_view(variable)
    assert np.shares_memory(first, second)  # a view, not a copy
    expected = values if dtype == "float32" else values.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(first, "float32"), np.asarray(expected, "float32"))


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_blocks_are_the_weight(monkeypatch, transposed, dtype):
    monkeypatch.setattr(streamed_tensor, "_BLOCK", 7)  # several blocks, the last one short
    values = np.random.default_rng(1).normal(size=(9, 4)).astype("float32")
    variable = keras.Variable(values, dtype=dtype)
    shape = (4, 9) if transposed else (9, 4)
    tensor = StreamedTensor(variable, shape, transposed)
    blocks = list(tensor.blocks())
    assert len(blocks) > 2 and all(block.dtype == np.float32 for block in blocks)
    expected = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32")))
    np.testing.assert_array_equal(np.concatenate(blocks).reshape(shape), expected.T if transposed else expected)
    np.testing.assert_array_equal(np.asarray(tensor), expected.T if transposed else expected)
