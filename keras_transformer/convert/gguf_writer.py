"""GGUFStreamWriter: a GGUF file written tensor by tensor, as each tensor is ready, in any order.

The `gguf` package's GGUFWriter writes the header, the metadata and the tensor table, then the tensors in the
table's order, and holds every tensor until then (or copies them through a temporary file). A GGUF tensor table
gives each tensor's offset in the data section, and each offset follows from the shapes and types before it, so
this writer lays the table out first (with GGUFWriter, so that the bytes are the ones it writes), then writes each
tensor at its offset when it arrives: the export holds one tensor, not a copy of the model, and nothing is copied
twice on disk.

Tensor types, as llama.cpp's converter writes them: one-dimensional tensors (norms, biases) F32; a matrix whose rows
are not a whole number of blocks (32 values) F16 when a block type was asked for, with a log line; the others in the
type asked for, quantized by the `gguf` package.
"""

import logging

import gguf
import numpy as np

_log = logging.getLogger(__name__)


def tensor_type(name, shape, asked):
    """The ggml type the tensor `name` of `shape` is written in when `asked` (a GGMLQuantizationType) is asked."""
    if len(shape) == 1 or asked == gguf.GGMLQuantizationType.F32:
        return gguf.GGMLQuantizationType.F32
    block, _ = gguf.GGML_QUANT_SIZES[asked]
    if shape[-1] % block:
        _log.info(
            "GGUF export: %s has rows of %d values, not whole %d-value blocks: written F16.", name, shape[-1], block
        )
        return gguf.GGMLQuantizationType.F16
    return asked


def encode(array, kind):
    """A float array -> its bytes in the ggml type `kind` (numpy order, as GGUFWriter writes them)."""
    array = np.ascontiguousarray(array, dtype="float32")
    if kind == gguf.GGMLQuantizationType.F32:
        return array
    if kind == gguf.GGMLQuantizationType.F16:
        return array.astype("float16")
    return gguf.quants.quantize(array, kind)


class GGUFStreamWriter:
    """Writes a GGUF file's tensors at their offsets as they arrive.

    Args:
        writer: a `gguf.GGUFWriter` for the file, holding its metadata and no tensors.
        tensors: {GGUF name: (shape in numpy order, GGMLQuantizationType)}, in the file's order.

    `add(name, array)` writes one tensor (float32, in its shape); `close()` checks that every tensor was written once
    and closes the file.
    """

    def __init__(self, writer, tensors):
        self.writer, self.tensors = writer, tensors
        self.offsets, offset = {}, 0
        for name, (shape, kind) in tensors.items():
            nbytes = int(np.prod(gguf.quant_shape_to_byte_shape(shape, kind), dtype=np.int64))
            writer.add_tensor_info(name, shape, np.dtype("float32"), nbytes, raw_dtype=kind)
            self.offsets[name] = (offset, nbytes)
            offset += gguf.GGUFWriter.ggml_pad(nbytes, writer.data_alignment)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        self.file = writer.fout[0]
        writer.write_padding(self.file, self.file.tell())
        self.start = self.file.tell()
        self.written = set()

    def add(self, name, array):
        if name not in self.tensors or name in self.written:
            raise ValueError(f"GGUF export: the tensor {name!r} is not in the file's table, or written twice.")
        shape, kind = self.tensors[name]
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"GGUF export: the tensor {name!r} has the shape {array.shape}, its table entry {shape}.")
        data = encode(array, kind)
        offset, nbytes = self.offsets[name]
        if data.nbytes != nbytes:
            raise ValueError(f"GGUF export: {name!r} encodes to {data.nbytes} bytes, its table entry {nbytes}.")
        self.file.seek(self.start + offset)
        self.file.write(memoryview(np.ascontiguousarray(data)).cast("B"))
        self.writer.write_padding(self.file, nbytes)
        self.written.add(name)

    def close(self):
        missing = [name for name in self.tensors if name not in self.written]
        if missing:
            raise ValueError(f"GGUF export: {len(missing)} tensor(s) were not written, e.g. {missing[0]!r}.")
        self.writer.close()


__all__ = ["GGUFStreamWriter", "encode", "tensor_type"]
