"""Kernels: what runs differently per backend, keyed by what it computes, beside the one table of layer types.

- `kernel_table.py`: the layer types a cached decoding step is made of, each with its kernel's name;
- `torch_kernels.py` (with `torch_attention.py`, `torch_weights.py`): the plain-PyTorch kernel of each layer
  type, which the PyTorch decoding step runs instead of Keras's layer calls;
- `onnx_kernels.py` (with `onnx_values.py`): the ONNX nodes of each layer type, which the in-place ONNX
  decode graph is built from (`export/decode_graph.py`);
- `loop_ops.py`: the decoding loop's few tensor operations whose fast form differs by backend.

Nothing is imported here: the PyTorch kernels need torch and the ONNX kernels need onnx, optional
dependencies that only their callers load.
"""
