"""Our GGUF export (`task.export(path, format="gguf")`), read back by transformers' own GGUF reader
(`from_pretrained(..., gguf_file=...)`, an independent reader), by ours, and compared with llama.cpp's converter.

Axes: B batch, T length, V vocabulary.
"""

import re

import gguf
import numpy as np
import pytest
import torch
import transformers

from keras_transformer import cli
from keras_transformer.convert import gguf_writer
from keras_transformer.convert.gguf_writer import encode
from keras_transformer.models import CausalLM
from keras_transformer.models.lora import enable_lora
from tests.conftest import to_numpy
from tests.convert import hf_models
from tests.convert.hf_export_cases import CHAT_TEMPLATE

ATOL = 1e-4
TOKEN_IDS = np.array([[5, 17, 42, 99, 100, 3, 7, 250], [1, 2, 3, 4, 5, 6, 7, 8]])  # (B, T)
TEXTS = ["def add(a, b):\n    return a + b", "  the quick  brown fox 🙂 é <|endoftext|>"]
# A weight's largest rounding, relative to the tensor's amax (see test_gguf_read.py's WEIGHT_RTOL).
WEIGHT_RTOL = {"q8_0": 1.05 / 254, "q4_0": 1.05 / 8}


def logits(lm, ids=TOKEN_IDS):
    return to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))  # (B, T, V)


def transformers_logits(path, **config):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, attn_implementation="eager", dtype=torch.float32, **config
    ).eval()
    with torch.no_grad():
        return model(torch.tensor(TOKEN_IDS)).logits.numpy()


def tensors(path):
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> our model: the gpt_stdlib and llama_stdlib presets, and a random Qwen3 (query/key norms, head size
    128: transformers' GGUF reader takes Qwen3's head size from its config default, not from key_length)."""
    source = tmp_path_factory.mktemp("qwen3_source")
    hf_models.llama_style(source, "qwen3")
    models = {name: CausalLM.from_preset(name) for name in ("gpt_stdlib", "llama_stdlib")}
    models["llama_stdlib"].preprocessor.tokenizer.chat_template = CHAT_TEMPLATE
    return models | {"qwen3": CausalLM.from_preset(source)}


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    """(name, gguf_type) -> the exported file (each written once per module)."""
    out = tmp_path_factory.mktemp("gguf_export")
    cache = {}

    def get(name, gguf_type="f32"):
        if (name, gguf_type) not in cache:
            path = out / f"{name}_{gguf_type}.gguf"
            cache[name, gguf_type] = models[name].export(path, format="gguf", gguf_type=gguf_type)
        return cache[name, gguf_type]

    return get


@pytest.mark.parametrize("name", ["gpt_stdlib", "llama_stdlib", "qwen3"])
def test_transformers_reads_our_export(models, exported, name):
    """Logits (F32) and tokenizer ids, the start token included where the preprocessor adds one."""
    path = exported(name)
    config = {"n_positions": models[name].backbone.max_sequence_length} if name == "gpt_stdlib" else {}
    # transformers maps GPT-2's context_length onto n_ctx only; its position table is n_positions long
    np.testing.assert_allclose(logits(models[name]), transformers_logits(path, **config), atol=ATOL, rtol=0)
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    preprocessor = models[name].preprocessor
    assert preprocessor.generate_preprocess(TEXTS) == [theirs(text)["input_ids"] for text in TEXTS]
    assert theirs.chat_template == preprocessor.tokenizer.chat_template  # None but for llama_stdlib


@pytest.mark.parametrize("name", ["gpt_stdlib", "llama_stdlib", "qwen3"])
def test_f32_round_trip_is_exact(models, exported, name):
    back = CausalLM.from_preset(exported(name))
    for ours, theirs in zip(models[name].weights, back.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs), err_msg=ours.path)
    assert back.preprocessor.tokenizer.chat_template == models[name].preprocessor.tokenizer.chat_template


@pytest.mark.parametrize("gguf_type", ["f16", "bf16", "q8_0", "q4_0"])
def test_typed_round_trip(models, exported, gguf_type):
    path = exported("llama_stdlib", gguf_type)
    back = CausalLM.from_preset(path)
    source = to_numpy(models["llama_stdlib"].backbone.token_embedding.embeddings)  # (V, D)
    error = np.abs(to_numpy(back.backbone.token_embedding.embeddings) - source).max()
    rtol = WEIGHT_RTOL.get(gguf_type, {"f16": 2**-11, "bf16": 2**-8}.get(gguf_type))
    assert 0 < error <= rtol * np.abs(source).max()
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert kinds["token_embd.weight"] == gguf_type.upper() and kinds["output_norm.weight"] == "F32"
    np.testing.assert_allclose(logits(back), transformers_logits(path), atol=ATOL, rtol=0)


# Keys llama.cpp writes that our configs do not hold: Phi-3's original context length (read for longrope only).
NOT_HELD = {"phi3.rope.scaling.original_context_length"}
TOKENIZER_KEYS = ("tokens", "token_type", "merges", "scores", "add_space_prefix", "bos_token_id", "eos_token_id")


@pytest.mark.parametrize(
    "name, gguf_type",
    [
        ("llama", "f32"),
        ("llama_f16", "f16"),
        ("qwen3moe", "f32"),
        ("mixtral", "f32"),
        ("phi3", "f32"),
        ("gemma3", "f32"),
        ("sentencepiece", "f32"),
    ],
)
def test_llama_cpp_file_round_trips_to_the_same_tensors(llama_cpp_files, tmp_path, name, gguf_type):
    """llama.cpp's F32 / F16 file -> ours (float32) -> our export in the same type: the same tensors (llama's permuted
    query/key rows included; Qwen3-MoE's and Mixtral's stacked experts and routers; Phi-3's fused qkv and gate/up;
    Gemma 3's norms stored as 1 + w) of the same types, bit for bit, the same values of every architecture key
    llama.cpp wrote (Phi-3's partial rotary and window, Gemma 3's head size, window and local rotary base), and the
    same tokenizer: byte-level BPE tokens and merges, or SentencePiece tokens, scores and token types."""
    source, _ = llama_cpp_files[name]
    out = CausalLM.from_preset(source).export(tmp_path / "again.gguf", format="gguf", gguf_type=gguf_type)
    theirs, ours = tensors(source), tensors(out)
    assert sorted(theirs) == sorted(ours)
    for tensor_name, array in theirs.items():
        np.testing.assert_array_equal(ours[tensor_name], array, err_msg=tensor_name)
    types = [{t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors} for path in (source, out)]
    assert types[0] == types[1]
    a, b = gguf.GGUFReader(source).fields, gguf.GGUFReader(out).fields
    architecture = a["general.architecture"].contents()
    assert b["general.architecture"].contents() == architecture
    for key in [key for key in a if key.startswith(architecture + ".") and key not in NOT_HELD]:
        assert key in b and a[key].contents() == b[key].contents(), key
    for key in [f"tokenizer.ggml.{key}" for key in TOKENIZER_KEYS if f"tokenizer.ggml.{key}" in a]:
        assert key in b and a[key].contents() == b[key].contents(), key


def test_phi3_and_gemma3_options_llama_cpp_lacks_are_refused(llama_cpp_files, tmp_path):
    """A Gemma 3 whose layer pattern is not llama.cpp's (every 6th layer global), and a model with a window and
    query/key norms (neither phi3 nor llama/qwen): refused by name, nothing written."""
    for name, option, value in (("gemma3", "layer_types", ["full_attention"] * 2), ("phi3", "query_key_norm", "head")):
        lm = CausalLM.from_preset(llama_cpp_files[name][0])
        backbone = type(lm.backbone).from_config({**lm.backbone.get_config(), option: value})
        task = type(lm)(backbone=backbone, preprocessor=lm.preprocessor)
        _assert_refused(task, tmp_path / f"{name}.gguf", re.escape(f"{option}={value!r}"))


def test_lora_is_merged(tmp_path):
    lm = CausalLM.from_preset("llama_stdlib")
    enable_lora(lm.backbone, rank=2)
    rng = np.random.default_rng(4)
    for variable in lm.backbone.weights:
        if "lora_kernel" in variable.path:
            variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))
    path = lm.export(tmp_path / "lora.gguf", format="gguf", gguf_type="f32")
    np.testing.assert_allclose(logits(CausalLM.from_preset(path)), logits(lm), atol=ATOL, rtol=0)
    assert np.abs(logits(CausalLM.from_preset("llama_stdlib")) - logits(lm)).max() > 1e-2  # the factors count
    assert any("lora_kernel" in v.path for v in lm.backbone.weights)  # the model keeps its LoRA


def _assert_refused(task, target, match, **options):
    with pytest.raises(ValueError, match=match):
        task.export(target, format="gguf", **options)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no temporary file either


def test_refusals(models, tmp_path):
    lm = models["llama_stdlib"]
    _assert_refused(lm, tmp_path / "a.gguf", "quantize=None. Received: quantize='int8'", quantize="int8")
    _assert_refused(lm, tmp_path / "a.gguf", r"gguf_type=\'q4_k\'", gguf_type="q4_k")
    _assert_refused(lm, tmp_path / "a.bin", "ends in .gguf")
    quantized = CausalLM.from_preset("llama_stdlib")
    quantized.quantize("int8")
    _assert_refused(quantized, tmp_path / "a.gguf", r"quantized \(int8\) in Keras.*quantize=None")


def test_overwrite_and_atomic_write(models, tmp_path, monkeypatch):
    lm, target = models["gpt_stdlib"], tmp_path / "gpt.gguf"
    lm.export(target, format="gguf")
    before = target.read_bytes()
    with pytest.raises(ValueError, match="already exists: pass overwrite=True"):
        lm.export(target, format="gguf")

    calls = []

    def fail(array, kind):  # the third tensor: the temporary file already holds two, written at their offsets
        calls.append(kind)
        if len(calls) == 3:
            raise RuntimeError("interrupted")
        return encode(array, kind)

    monkeypatch.setattr(gguf_writer, "encode", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        lm.export(target, format="gguf", overwrite=True)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["gpt.gguf"]
    monkeypatch.undo()
    lm.export(target, format="gguf", gguf_type="q8_0", overwrite=True)
    assert target.read_bytes() != before


def test_a_long_export_says_where_it_is(models, tmp_path, capsys):
    """verbose=True: a line when the weights start and end, a progress bar over the file's tensors; "auto" says
    nothing for a model this small."""
    lm = models["gpt_stdlib"]
    lm.export(tmp_path / "quiet.gguf", format="gguf")
    assert capsys.readouterr().out == ""
    lm.export(tmp_path / "loud.gguf", format="gguf", gguf_type="q8_0", verbose=True)
    out = capsys.readouterr().out
    count = len(gguf.GGUFReader(tmp_path / "loud.gguf").tensors)  # GPT-2's tensors keep their number in GGUF
    assert "GGUF (q8_0): the weights, tensor by tensor ..." in out and f"{count}/{count}" in out
    assert "GGUF (q8_0): the weights, tensor by tensor: done in" in out


def test_cli_export(models, tmp_path):
    target = tmp_path / "gpt.gguf"
    assert cli.main(["export", "gpt_stdlib", str(target), "--format", "gguf", "--gguf-type", "q8_0"]) == 0
    assert {t.tensor_type.name for t in gguf.GGUFReader(target).tensors} == {"Q8_0", "F32"}
    assert cli.main(["export", "gpt_stdlib", str(tmp_path / "x"), "--gguf-type", "q8_0"]) == 2  # onnx has no type
