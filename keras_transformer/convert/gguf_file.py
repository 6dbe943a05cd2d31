"""GGUFFile: one GGUF checkpoint (a single file, or the parts of a split one) opened with llama.cpp's own reader.

The `gguf` package (llama.cpp's gguf-py) parses the file; nothing here parses bytes. What this class adds is
the checks the reader leaves to its callers, done before any tensor is read, so that a damaged file is refused
whole, with a ValueError naming what is wrong, and nothing is half-loaded:
- the magic bytes and version (the reader's own errors, reworded with the file's name);
- every tensor's type is one we dequantize (`TENSOR_TYPES`), named with its ggml type id otherwise;
- every tensor's bytes lie inside the file (a truncated download is named by its first tensor past the end);
- a split checkpoint (`name-00001-of-00003.gguf`) has all its parts, each holding the tensors it announces.

Tensors are dequantized by `gguf.quants.dequantize` (the same code llama.cpp's Python tools use) into float32
numpy arrays in the reader's (torch-like) axis order: a weight stored with ggml dims (in, out) reads (out, in).
"""

import functools
import re
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

# The ggml types this loader dequantizes (gguf's numpy dequantization covers each one).
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_parts(path):
    """The files of the checkpoint `path` names: [path], or every part of a split checkpoint, in order."""
    path = Path(path)
    match = _SPLIT.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    return [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


class _CheckedReader(gguf.GGUFReader):
    """gguf.GGUFReader, with the tensor table checked before its tensors are mapped: a type we do not read, or
    a tensor whose bytes run past the end of the file, is a ValueError naming the tensor (the reader would
    raise a bare reshape error, or map a short array)."""

    def _build_tensors(self, start_offs, fields):
        for field in fields:
            _, name, _, dims, raw_type, offset = field.parts
            name = bytes(name).decode("utf-8", errors="replace")
            type_id = int(raw_type[0])
            if type_id not in gguf.GGMLQuantizationType._value2member_map_:
                raise ValueError(f"tensor {name!r} has the unknown ggml type id {type_id}")
            kind = gguf.GGMLQuantizationType(type_id)
            if kind.name not in TENSOR_TYPES:
                raise ValueError(
                    f"tensor {name!r} has the ggml type {kind.name} (id {type_id}), which keras_transformer "
                    f"does not read; readable types: {', '.join(TENSOR_TYPES)}"
                )
            block, size = gguf.GGML_QUANT_SIZES[kind]
            elements = int(np.prod(dims))
            end = int(start_offs) + int(offset[0]) + elements * size // block
            if elements % block or end > len(self.data):
                raise ValueError(
                    f"tensor {name!r} ({kind.name}, {elements} elements) ends at byte {end}, past the end of the "
                    f"file ({len(self.data)} bytes): the file is truncated or corrupted"
                )
        super()._build_tensors(start_offs, fields)


class GGUFFile:
    """A GGUF checkpoint: its metadata (`fields`, read with `value`) and its tensors (`tensor`), parts joined.

    Args:
        path: the `.gguf` file, or any part of a split checkpoint (all its parts are opened).

    Example:
    >>> # Reads a file written elsewhere: not run by the doctests (tests/convert/test_gguf_read.py runs it).
    >>> checkpoint = GGUFFile("model.gguf")  # doctest: +SKIP
    >>> checkpoint.architecture, checkpoint.value("llama.block_count")  # doctest: +SKIP
    ('llama', 16)
    """

    def __init__(self, path):
        self.path = Path(path)
        self.parts = split_parts(self.path)
        missing = [str(part) for part in self.parts if not part.is_file()]
        if missing:
            raise ValueError(f"The GGUF checkpoint {self.path} is missing: {', '.join(missing)}.")
        self.readers = []
        for part in self.parts:
            try:
                self.readers.append(_CheckedReader(part))
            except (ValueError, KeyError, IndexError, TypeError, OSError) as error:
                raise ValueError(f"{part} is not a readable GGUF file: {_reworded(error, part)}.") from None
        self.fields = {name: field for name, field in self.readers[0].fields.items() if not name.startswith("GGUF.")}
        self.tensors = {}
        for part, reader in zip(self.parts, self.readers):
            announced = _field_value(reader.fields.get("split.tensors.count"))
            for tensor in reader.tensors:
                if tensor.name in self.tensors:
                    raise ValueError(f"The GGUF checkpoint {self.path} holds the tensor {tensor.name!r} twice.")
                self.tensors[tensor.name] = tensor
            if len(self.parts) > 1 and announced is not None and part == self.parts[-1]:
                if int(announced) != len(self.tensors):
                    raise ValueError(
                        f"The split GGUF checkpoint {self.path} announces split.tensors.count={announced}, "
                        f"its {len(self.parts)} parts hold {len(self.tensors)} tensors."
                    )
        self.architecture = self.value("general.architecture")

    def value(self, key, default=None):
        """The metadata value `key` (a number, a string, or a list for arrays), or `default` when absent."""
        return _field_value(self.fields.get(key), default)

    def tensor_type(self, name):
        return self.tensors[name].tensor_type.name

    def shape(self, name):
        """A tensor's shape in numpy order (ggml's dims reversed): a (out, in) weight reads (out, in)."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def tensor(self, name):
        """The tensor `name` dequantized to a float32 numpy array, in numpy order (see `shape`)."""
        tensor = self.tensors[name]
        return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype="float32").reshape(self.shape(name))


def open_checkpoint(path):
    """GGUFFile(path), parsed once while its files are unchanged: one `from_preset` reads a preset's config several
    times, and gguf's reader spends seconds in Python on a large vocabulary's metadata (benchmarks/RESULTS.md,
    "Load time and memory at the SmolLM2-135M shape")."""
    parts = split_parts(Path(path).absolute())  # not resolve(): a part linked from elsewhere keeps its folder
    stamps = tuple((str(part), part.stat().st_mtime_ns, part.stat().st_size) for part in parts if part.is_file())
    return _open(Path(path).absolute(), stamps)


@functools.lru_cache(maxsize=2)
def _open(path, stamps):
    del stamps  # the cache key: a rewritten file is parsed again
    return GGUFFile(path)


def _field_value(field, default=None):
    if field is None:
        return default
    value = field.contents()
    return value


def _reworded(error, part):
    text = str(error)
    if text == "GGUF magic invalid":
        with open(part, "rb") as f:
            head = f.read(4)
        return f"bad magic {head!r} (a GGUF file starts with b'GGUF')"
    return text or type(error).__name__


__all__ = ["TENSOR_TYPES", "GGUFFile", "open_checkpoint", "split_parts"]
