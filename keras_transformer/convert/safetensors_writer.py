"""SafetensorsWriter: a checkpoint's safetensors files written tensor by tensor, as each tensor is ready.

The `safetensors` library writes a file from a dict of every tensor at once, which would hold a
copy of the whole model; this writer holds one tensor. Each tensor's bytes go to the end of its
shard's data file as it arrives; `close` writes each shard as safetensors' 8-byte header length,
the JSON header (padded with spaces to 8 bytes, as the library pads it) and the data, copied from
disk in chunks. The files read back with `safetensors.safe_open` and `transformers`'
`from_pretrained` like those `save_pretrained` writes: "model.safetensors", or
"model-00001-of-0000N.safetensors" shards and "model.safetensors.index.json".
"""

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
from huggingface_hub import constants
from huggingface_hub.serialization._base import parse_size_to_int

from keras_transformer.convert.streamed_tensor import StreamedTensor

_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
_ALIGN = 8
_COPY_CHUNK = 8 * 2**20


def _encoded(array, dtype):
    """A float32 array -> a contiguous array of its little-endian bytes in `dtype`, rounded to nearest even as torch
    rounds `save_pretrained`'s tensors (bfloat16 by `ml_dtypes`, which Keras requires: numpy has no bfloat16)."""
    array = np.ascontiguousarray(array, dtype="<f4")
    if dtype != "float32":
        array = array.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else "<f2")
    return array.reshape(-1).view("u1")  # (N,) values -> (N * itemsize,) bytes


def _copy(path, out):
    """Append the file at `path` to `out` through one reused buffer (a new buffer per chunk, as
    `shutil.copyfileobj` reads, can hold two chunks at once until the old one is freed)."""
    buffer = memoryview(bytearray(_COPY_CHUNK))
    with open(path, "rb", buffering=0) as data:
        while count := data.readinto(buffer):
            out.write(buffer[:count])


class SafetensorsWriter:
    """Writes tensors to the safetensors files of a Hugging Face checkpoint folder as they arrive.

    Args:
        directory: the folder to write into.
        dtype: "float32", "float16" or "bfloat16", the stored dtype of every tensor.
        max_shard_size: int bytes or a string such as "5GB": a shard is closed before a tensor would take
            it past this size (a tensor larger than it gets a shard of its own), as `save_pretrained` splits.
    """

    def __init__(self, directory, dtype, max_shard_size):
        if dtype not in _DTYPES:
            raise ValueError(f"`dtype` must be one of {tuple(_DTYPES)}. Received: dtype={dtype!r}")
        self.directory = Path(directory)
        self.dtype = dtype
        self.max_shard_size = parse_size_to_int(max_shard_size) if isinstance(max_shard_size, str) else max_shard_size
        self.scratch = Path(tempfile.mkdtemp(prefix=".shards.", dir=self.directory))
        self.shards = []  # [(data file, {name: (shape, begin, end)}, size)]

    def add(self, name, array):
        """Append `array` (float32, in the checkpoint's shape; or a `StreamedTensor`, written a block at a
        time) as tensor `name`."""
        nbytes = int(np.prod(array.shape, dtype=np.int64)) * _ITEMSIZE[self.dtype]
        if not self.shards or (self.shards[-1][2] and self.shards[-1][2] + nbytes > self.max_shard_size):
            self.shards.append([self.scratch / f"{len(self.shards)}.bin", {}, 0])
        shard = self.shards[-1]
        blocks = array.blocks() if isinstance(array, StreamedTensor) else (array,)
        with open(shard[0], "ab") as file:
            for block in blocks:
                file.write(_encoded(block, self.dtype))
            if file.tell() != shard[2] + nbytes:
                raise ValueError(f"Tensor {name!r}: {file.tell() - shard[2]} bytes written, {nbytes} expected.")
        shard[1][name] = (tuple(array.shape), shard[2], shard[2] + nbytes)
        shard[2] += nbytes

    def close(self, total_parameters):
        """Write the shard files (and the index when there are several); returns their names."""
        count = len(self.shards) or 1
        names = (
            [constants.SAFETENSORS_SINGLE_FILE]
            if count == 1
            else [f"model-{number:05d}-of-{count:05d}.safetensors" for number in range(1, count + 1)]
        )
        weight_map = {}
        for name, (data_file, entries, _) in zip(names, self.shards or [[None, {}, 0]]):
            self._write_shard(self.directory / name, data_file, entries)
            weight_map.update(dict.fromkeys(entries, name))
        if count > 1:
            total_size = sum(shard[2] for shard in self.shards)
            index = {
                "metadata": {"total_parameters": total_parameters, "total_size": total_size},
                "weight_map": dict(sorted(weight_map.items())),
            }
            text = json.dumps(index, indent=2, sort_keys=True) + "\n"
            (self.directory / constants.SAFETENSORS_INDEX_FILE).write_text(text, encoding="utf-8")
        shutil.rmtree(self.scratch)
        return names

    def _write_shard(self, path, data_file, entries):
        kind = _DTYPES[self.dtype]
        header = {"__metadata__": {"format": "pt"}}
        for name in sorted(entries):
            shape, begin, end = entries[name]
            header[name] = {"dtype": kind, "shape": list(shape), "data_offsets": [begin, end]}
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % _ALIGN)
        with open(path, "wb") as out:
            out.write(struct.pack("<Q", len(text)))
            out.write(text)
            if data_file is not None:
                _copy(data_file, out)
                os.remove(data_file)


__all__ = ["SafetensorsWriter"]
