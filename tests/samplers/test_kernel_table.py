"""Every runtime that runs decoding steps without Keras covers every layer type of the one kernel table
(layers/kernel_table.py): PyTorch's kernels and the ONNX graph builder, generated from the table."""

import pytest

from keras_transformer.export import onnx_kernels
from keras_transformer.layers import kernel_table
from keras_transformer.samplers import torch_kernels

RUNTIMES = {"torch": torch_kernels._KERNELS, "onnx": onnx_kernels.KERNELS}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("layer_type", list(kernel_table.KERNEL_NAMES), ids=lambda t: t.__name__)
def test_runtime_has_the_tables_kernel(runtime, layer_type):
    kernel = RUNTIMES[runtime][layer_type]
    assert kernel.__name__ == f"_{kernel_table.KERNEL_NAMES[layer_type]}"
    assert set(RUNTIMES[runtime]) == set(kernel_table.KERNEL_NAMES)  # nothing outside the table


def test_bind_refuses_a_runtime_missing_a_kernel():
    namespace = {f"_{name}": print for name in kernel_table.KERNEL_NAMES.values()}
    del namespace["_feed_forward"]
    with pytest.raises(ValueError, match="_feed_forward"):
        kernel_table.bind(namespace)
