"""The answer in benchmarks/RESULTS.md ("GGUF"), checked and used: a Q4_0 tensor is exactly a Keras int4 Dense
kernel with 32-wide blocks (Keras 3.15's sub-channel int4: per block and output a float32 scale and an int8 zero point,
w = scale * (q - zero) with q in [-8, 7]), taking the block's float16 scale d and the zero point 0, since Q4_0 stores
w = d * (nibble - 8). Two references, neither ours: gguf's quantizer / dequantizer and Keras's int4 layer.
`from_preset("model.gguf", quantize="int4")` (convert/gguf_int4.py) puts a file's Q4_0 blocks into int4 layers so;
its tests compare with the float load of the same file and with gguf's own reader of it.

Axes: B batch, T length, V vocabulary, O outputs, I inputs, G blocks of 32 inputs, R and C a kernel's rows and columns.
"""

from pathlib import Path

import gguf
import keras
import numpy as np
import pytest
from keras import quantizers

from keras_transformer.models import CausalLM, LlamaBackbone
from tests.conftest import to_numpy
from tests.convert import hf_models

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


# --- from_preset("model.gguf", quantize="int4"): the file's Q4_0 blocks in Keras's int4 layers --------------------

TOKEN_IDS = np.array([[5, 17, 42, 99, 100, 3, 7, 250], [1, 2, 3, 4, 5, 6, 7, 8]])  # (B, T)


@pytest.fixture(scope="module")
def q4_files(tmp_path_factory):
    """name -> our Q4_0 export: gpt_stdlib (gpt2: fused query/key/value, Conv1D layouts, a Q4_0 token embedding)
    and a random Llama (llama: query/key rows permuted in the file, untied head, grouped-query attention)."""
    out = tmp_path_factory.mktemp("gguf_int4")
    hf_models.llama_style(out / "llama_source", "llama")
    sources = {"gpt": CausalLM.from_preset("gpt_stdlib"), "llama": CausalLM.from_preset(out / "llama_source")}
    return {name: lm.export(out / f"{name}.gguf", format="gguf", gguf_type="q4_0") for name, lm in sources.items()}


@pytest.fixture(scope="module")
def loads(q4_files):
    """name -> (the float load, the int4 load) of the same Q4_0 file."""
    return {
        name: (CausalLM.from_preset(path), CausalLM.from_preset(path, quantize="int4"))
        for name, path in q4_files.items()
    }


def _logits(lm):
    return to_numpy(lm({"token_ids": TOKEN_IDS, "padding_mask": np.ones_like(TOKEN_IDS)}))  # (B, T, V)


def _int4_kernel(layer):
    """An int4 layer's stored numbers (R, C) int8 and scales (R / 32, C), and its kernel as it computes with it."""
    columns = getattr(layer, "_int4_unpacked_column_size", None) or layer.units
    q = to_numpy(quantizers.unpack_int4(layer._kernel, columns, axis=-1))  # (R, C)
    scale, zero = to_numpy(layer.kernel_scale), to_numpy(layer.kernel_zero)
    return q, scale, np.repeat(scale, BLOCK, axis=0) * (q - np.repeat(zero, BLOCK, axis=0))


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_int4_load_keeps_the_files_blocks(loads, name):
    """Every projection is int4 with 32-wide blocks, and computes with exactly the float load's kernel (the file's
    Q4_0 weights as gguf dequantizes them); the outputs agree within float rounding."""
    float_lm, int4_lm = loads[name]
    pairs = [
        (f, q)
        for f, q in zip(float_lm._flatten_layers(), int4_lm._flatten_layers())
        if isinstance(q, (keras.layers.Dense, keras.layers.EinsumDense))
    ]
    assert pairs and all(q.quantization_mode == "int4" and q._int4_block_size == BLOCK for _, q in pairs)
    for f, q in pairs:
        _, _, kernel = _int4_kernel(q)
        np.testing.assert_array_equal(kernel.reshape(to_numpy(f.kernel).shape), to_numpy(f.kernel), err_msg=q.path)
    expected = _logits(float_lm)
    np.testing.assert_allclose(_logits(int4_lm), expected, atol=1e-5 * np.abs(expected).max(), rtol=0)
    assert int4_lm.generate("def add(", max_new_tokens=8) == float_lm.generate("def add(", max_new_tokens=8)


def test_int4_numbers_and_scales_are_the_files(loads, q4_files):
    """The feed-forward output projection of Llama's layer 0 (kernel (F, D) = the file's (D, F) transposed): its
    int4 numbers are the file's 4-bit numbers - 8 and its scales the blocks' float16 d, read with gguf's reader; a
    LlamaBackbone loaded alone with quantize="int4" holds the same numbers."""
    tensor = {t.name: t for t in gguf.GGUFReader(q4_files["llama"]).tensors}["blk.0.ffn_down.weight"]
    blocks = np.asarray(tensor.data)  # (D, G * 18) bytes
    D, F = blocks.shape[0], blocks.shape[1] // 18 * BLOCK
    scale = blocks.reshape(D, F // BLOCK, 18)[:, :, :2].copy().view("<f2")[..., 0].astype("float32")  # (D, G)
    reference = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_0)  # (D, F)
    layer = loads["llama"][1].backbone.transformer_layers[0].feed_forward.output_dense
    q, stored_scale, _ = _int4_kernel(layer)  # (F, D), (G, D)
    np.testing.assert_array_equal(stored_scale, scale.T)
    np.testing.assert_array_equal(q, np.rint(reference / np.repeat(scale, BLOCK, axis=1)).T)
    assert q.min() >= -8 and q.max() <= 7 and np.abs(q).max() == 8  # Q4_0 puts each block's extreme at -8
    backbone = LlamaBackbone.from_preset(q4_files["llama"], quantize="int4")  # a backbone alone, the same way
    np.testing.assert_array_equal(_int4_kernel(backbone.transformer_layers[0].feed_forward.output_dense)[0], q)


def test_int4_refuses_what_it_cannot_keep(loads, tmp_path):
    """A projection that is not Q4_0 (F16: llama_stdlib's feed-forward width 366 is no whole number of blocks, so
    its down projection's rows are written F16; K-quants: the committed llama-quantize file), another mode, or a
    checkpoint that is not a GGUF file: each a ValueError naming it, before any weight is assigned."""
    path = CausalLM.from_preset("llama_stdlib").export(tmp_path / "l.gguf", format="gguf", gguf_type="q4_0")
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_down\.weight' is F16"):
        CausalLM.from_preset(path, quantize="int4")
    kquants = Path(__file__).parent / "data" / "llama_kquants.gguf"  # llama-quantize's K-quant mix
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_k\.weight' is Q3_K"):
        CausalLM.from_preset(kquants, quantize="int4")
    with pytest.raises(ValueError, match="quantize='int8'"):
        CausalLM.from_preset(path, quantize="int8")
    with pytest.raises(ValueError, match=r"'llama_stdlib' offers \[\].*quantize='int4'"):
        CausalLM.from_preset("llama_stdlib", quantize="int4")


def test_int4_load_saves_as_a_preset_and_loads_back(loads, tmp_path):
    """save_to_preset records the block size (config.json's quantization_block_size), so from_preset rebuilds the
    32-wide int4 layers and loads the same numbers and scales: the same logits, exactly."""
    int4_lm = loads["llama"][1]
    int4_lm.save_to_preset(tmp_path / "preset")
    back = CausalLM.from_preset(tmp_path / "preset")
    layer = back.backbone.transformer_layers[0].feed_forward.output_dense
    assert layer.quantization_mode == "int4" and layer._int4_block_size == BLOCK
    np.testing.assert_array_equal(_logits(back), _logits(int4_lm))
