"""Damaged and unsupported GGUF files: each is refused with a ValueError naming what is wrong, before any model is
built (the checks run on the metadata and the tensor table; a model is built only after all of them pass).

The files are our f32 export of llama_stdlib, damaged by hand or rewritten by the gguf package
(tests/convert/gguf_models.py).
"""

import shutil

import gguf
import numpy as np
import pytest

from keras_transformer.models import CausalLM
from tests.convert import gguf_models

STRING, UINT32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf_errors") / "llama.gguf"
    return CausalLM.from_preset("llama_stdlib").export(path, format="gguf", gguf_type="f32")


def damaged(good, tmp_path, edit):
    path = tmp_path / "damaged.gguf"
    shutil.copy(good, path)
    data = bytearray(path.read_bytes())
    data = edit(data) or data
    path.write_bytes(bytes(data))
    return path


def test_the_good_file_loads(good):
    assert type(CausalLM.from_preset(good)).__name__ == "LlamaCausalLM"


def test_bad_magic(good, tmp_path):
    path = damaged(good, tmp_path, lambda data: data.__setitem__(slice(0, 4), b"GGUX"))
    with pytest.raises(ValueError, match=r"bad magic b'GGUX'"):
        CausalLM.from_preset(path)


def test_truncated_tensor(good, tmp_path):
    path = damaged(good, tmp_path, lambda data: data[:-1000])
    with pytest.raises(ValueError, match=r"tensor '[\w.]+' \(F32, \d+ elements\) ends at byte \d+, past the end"):
        CausalLM.from_preset(path)


def _type_offset(good, name):
    """The byte offset of tensor `name`'s ggml type id in the file's tensor table."""
    reader = gguf.GGUFReader(good)
    (tensor,) = [t for t in reader.tensors if t.name == name]
    part = tensor.field.parts[4]  # name length, name, dims count, dims, type, offset
    return part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]


@pytest.mark.parametrize("type_id, message", [(99, "unknown ggml type id 99"), (16, "ggml type IQ2_XXS \\(id 16\\)")])
def test_unknown_tensor_type(good, tmp_path, type_id, message):
    offset = _type_offset(good, "blk.0.attn_q.weight")
    path = damaged(
        good, tmp_path, lambda data: data.__setitem__(slice(offset, offset + 4), type_id.to_bytes(4, "little"))
    )
    with pytest.raises(ValueError, match=f"tensor 'blk.0.attn_q.weight' has the {message}"):
        CausalLM.from_preset(path)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(architecture="mamba"), "general.architecture='mamba'"),
        (dict(add={"llama.attention.sliding_window": (4096, UINT32)}), "llama.attention.sliding_window=4096"),
        (dict(drop=["llama.rope.scaling.type"], add={"llama.rope.scaling.type": ("yarn", STRING)}), "'yarn'"),
        (dict(drop=["tokenizer.ggml.model"], add={"tokenizer.ggml.model": ("bert", STRING)}), "model='bert'"),
        (dict(drop=["tokenizer.ggml.pre"], add={"tokenizer.ggml.pre": ("tekken", STRING)}), "pre='tekken'"),
        (dict(tensors={"rope_freqs.weight": np.ones(8, "float32")}), "tensor 'rope_freqs.weight'"),
    ],
    ids=["architecture", "metadata", "rope-scaling", "tokenizer-model", "pre-tokenizer", "tensor"],
)
def test_unsupported_content(good, tmp_path, changes, message):
    path = tmp_path / "unsupported.gguf"
    gguf_models.rewrite(good, path, **changes)
    with pytest.raises(ValueError, match=message):
        CausalLM.from_preset(path)


def test_not_a_file_we_read(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="Unknown preset"):
        CausalLM.from_preset(path)
