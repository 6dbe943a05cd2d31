"""Export to the Hugging Face format: options (shards, dtype, no tokenizer), weights in other states
(LoRA, int8, int4), bad input and the trained presets. The cases are hf_export_cases.py's.
"""

import json
import logging
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import torch
import transformers

from keras_transformer import cli, export
from keras_transformer.convert import hf_export, hf_tokenizer, safetensors_writer, weight_recorder
from keras_transformer.models import GPTCausalLM, LlamaBackbone, LlamaCausalLM, TransformerSeq2SeqLM
from keras_transformer.models.lora import enable_lora
from tests.convert.hf_export_cases import ATOL, assert_same_weights, logits_pair, tensors


# --- options --------------------------------------------------------------------


def test_sharded_export_loads(build, tmp_path):
    c = build("gpt2")
    out = c.ours.export(tmp_path / "sharded", format="huggingface", max_shard_size="20KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert not (out / "model.safetensors").exists() and len(set(index["weight_map"].values())) > 1
    assert {p.name for p in out.glob("model-*.safetensors")} == set(index["weight_map"].values())
    exported = tensors(out)
    assert set(exported) == set(index["weight_map"])
    for key, tensor in tensors(c.out).items():
        assert torch.equal(tensor, exported[key]), key
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    mine, peer = logits_pair("gpt2", c.ours, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_is_chosen(build, tmp_path, dtype):
    c = build("qwen2")
    out = c.ours.export(tmp_path / dtype, format="huggingface", dtype=dtype)
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype
    exported, full = tensors(out), tensors(c.out)
    for key, tensor in exported.items():
        assert tensor.dtype == getattr(torch, dtype), key
        assert torch.equal(tensor, full[key].to(getattr(torch, dtype))), key  # rounded once, from float32


def test_weights_stream_tensor_by_tensor(build, tmp_path, monkeypatch):
    """Each tensor reaches its file as soon as the converter has filled it: the export never holds the whole model
    in the checkpoint's layout."""
    c = build("llama")
    held, added = [], []
    recorders = []
    original_init, original_add = weight_recorder.WeightRecorder.__init__, safetensors_writer.SafetensorsWriter.add

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        recorders.append(self)

    def add(self, name, array):
        held.append(sum(entry[0].nbytes for entry in recorders[-1].pending.values()) + array.nbytes)
        added.append(name)
        original_add(self, name, array)

    monkeypatch.setattr(weight_recorder.WeightRecorder, "__init__", init)
    monkeypatch.setattr(safetensors_writer.SafetensorsWriter, "add", add)
    out = c.ours.export(tmp_path / "streamed", format="huggingface")
    exported = tensors(out)
    assert sorted(added) == sorted(exported)  # each tensor once, through the streaming writer
    total = sum(tensor.numel() * 4 for tensor in exported.values())
    assert max(held) < total / 3, (max(held), total)  # a layer's tensors at most (the model has 2 layers)
    for key, tensor in tensors(c.out).items():
        assert torch.equal(tensor, exported[key]), key


def test_dtype_is_kept(build, tmp_path):
    """A bfloat16 model exports bfloat16 weights unless told otherwise."""
    c = build("gpt2")
    backbone = type(c.ours.backbone).from_config({**c.ours.backbone.get_config(), "dtype": "bfloat16"})
    lm = GPTCausalLM(backbone)
    lm.set_weights(c.ours.get_weights())  # rounded to bfloat16 once
    out = lm.export(tmp_path / "bf16", format="huggingface")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    full = tensors(c.out)
    for key, tensor in tensors(out).items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, full[key].to(torch.bfloat16)), key


def test_task_without_preprocessor(build, tmp_path):
    """No tokenizer files, no special-token ids (not GPT-2's defaults, outside this vocabulary)."""
    c = build("gpt2")
    out = GPTCausalLM(c.ours.backbone).export(tmp_path / "bare", format="huggingface")
    assert not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (None, None, None)
    for key, tensor in tensors(out).items():
        assert torch.equal(tensor, tensors(c.out)[key]), key


@pytest.mark.parametrize("name", ["gpt2", "llama"])  # GPT-2's fused c_attn; Llama's grouped key/value heads
def test_lora_is_merged(build, tmp_path, name):
    c = build(name)
    lm = type(c.ours).from_preset(c.source)
    enable_lora(lm.backbone, rank=2)
    rng = np.random.default_rng(4)
    for variable in lm.backbone.weights:
        if "lora_kernel" in variable.path:
            variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))
    out = lm.export(tmp_path / "lora", format="huggingface")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    mine, peer = logits_pair(name, lm, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    plain, _ = logits_pair(name, c.ours, theirs)
    assert np.abs(plain - peer).max() > 1e-2  # the factors changed the exported weights
    assert any("lora_kernel" in v.path for v in lm.backbone.weights)  # the model keeps its LoRA


# --- bad input -----------------------------------------------------------------


def _assert_refused(task, target, match, **options):
    with pytest.raises(ValueError, match=match):
        task.export(target, format="huggingface", **options)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no temporary folder either


def test_int8_model_exports_dequantized(build, tmp_path, caplog):
    """Each quantized kernel comes out within half an int8 step of the float model's (Keras's abs-max int8:
    one step is max|column| / 127 per output column); every other tensor is exact."""
    c = build("gpt2")
    lm = GPTCausalLM.from_preset(c.source)
    lm.quantize("int8")
    with caplog.at_level(logging.WARNING, logger=hf_export.__name__):
        out = lm.export(tmp_path / "int8", format="huggingface")
    assert "dequantized to float32" in caplog.text
    full, quantized = tensors(c.out), 0
    for key, tensor in tensors(out).items():
        reference = full[key]
        if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):  # GPT-2's (in, out) projections
            half_step = reference.abs().amax(dim=0, keepdim=True) / 254
            assert torch.all((tensor - reference).abs() <= half_step * 1.001 + 1e-7), key
            assert not torch.equal(tensor, reference), key  # the int8 rounding is there
            quantized += 1
        else:
            assert torch.equal(tensor, reference), key
    assert quantized == 4 * c.ours.backbone.num_layers  # attention c_attn, c_proj; mlp c_fc, c_proj
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    mine, peer = logits_pair("gpt2", c.ours, theirs)  # the float model's logits, near
    assert np.abs(mine - peer).max() < 0.1 * np.abs(mine).max()


def test_int4_model_is_refused(build, tmp_path):
    c = build("gpt2")
    lm = GPTCausalLM.from_preset(c.source)
    lm.quantize("int4")
    _assert_refused(lm, tmp_path / "q", r"int4.*quantize=None")


def test_int8_model_with_lora_is_refused(build, tmp_path):
    """LoRA over int8 kernels: no float kernel to merge into without choosing a rounding; refused by name."""
    c = build("gpt2")
    lm = GPTCausalLM.from_preset(c.source)
    lm.quantize("int8")
    enable_lora(lm.backbone, rank=2)
    _assert_refused(lm, tmp_path / "q", r"LoRA on int8 weights.*quantize=None")


def test_command_line_options(build, tmp_path):
    """--dtype and --max-shard-size reach the export; they are refused with another format."""
    c = build("gpt2")
    c.ours.save_to_preset(tmp_path / "preset")
    out = tmp_path / "out"
    command = ["export", str(tmp_path / "preset"), str(out), "--format", "huggingface"]
    assert cli.main(command + ["--dtype", "float16", "--max-shard-size", "20000"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    exported = tensors(out)
    for key, tensor in tensors(c.out).items():
        assert torch.equal(exported[key], tensor.to(torch.float16)), key
    assert cli.main(["export", str(tmp_path / "preset"), str(tmp_path / "onnx"), "--dtype", "float16"]) == 2
    assert not (tmp_path / "onnx").exists()


SUPPORTED = (
    r"\['BertClassifier', 'BertMaskedLM', 'GPTCausalLM', 'GemmaCausalLM', 'LlamaCausalLM', 'ModernBertMaskedLM', "
    r"'T5Seq2SeqLM'\]"
)


def test_unsupported_family_is_refused(tmp_path, capsys):
    """The preset transformer_base, through the command line: exit status 2, the error names the families."""
    target = tmp_path / "t"
    assert cli.main(["export", "transformer_base", str(target), "--format", "huggingface"]) == 2
    error = capsys.readouterr().err
    assert re.search(r"No Hugging Face class for a TransformerSeq2SeqLM.*" + SUPPORTED, error), error
    assert list(tmp_path.iterdir()) == []
    # The class alone decides (checked before anything is read), so an unbuilt instance will do.
    _assert_refused(TransformerSeq2SeqLM.__new__(TransformerSeq2SeqLM), target, "TransformerSeq2SeqLM.*" + SUPPORTED)


def test_layout_without_a_hugging_face_class_is_refused(tmp_path):
    backbone = LlamaBackbone(
        vocabulary_size=50,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        attention_bias=True,
        sliding_window=4,
    )  # Llama's biases with Mistral's window
    _assert_refused(LlamaCausalLM(backbone), tmp_path / "l", r"sliding_window=4.*" + SUPPORTED)


def test_bad_options_are_refused(build, tmp_path):
    c = build("gpt2")
    _assert_refused(c.ours, tmp_path / "d", r"dtype='int8'", dtype="int8")
    _assert_refused(c.ours, tmp_path / "s", r"max_shard_size=0", max_shard_size=0)
    with pytest.raises(ValueError, match=r"quantize=None"):
        c.ours.export(tmp_path / "q", format="huggingface", quantize="int8")
    assert not (tmp_path / "q").exists()


def test_a_long_export_says_where_it_is(build, tmp_path, capsys):
    """verbose=True: a line when the weights start and end, a progress bar over the checkpoint's tensors; "auto" says
    nothing for a model this small; a bad value is refused before anything is written."""
    c = build("gpt2")
    c.ours.export(tmp_path / "quiet", format="huggingface")
    assert capsys.readouterr().out == ""
    out_dir = c.ours.export(tmp_path / "loud", format="huggingface", verbose=True)
    out = capsys.readouterr().out
    count = len(tensors(out_dir))
    assert "Hugging Face: the weights, tensor by tensor ..." in out and f"{count}/{count}" in out
    assert "Hugging Face: the weights, tensor by tensor: done in" in out
    with pytest.raises(ValueError, match="verbose='yes'"):
        c.ours.export(tmp_path / "bad", format="huggingface", verbose="yes")
    assert not (tmp_path / "bad").exists()


def test_missing_transformers_names_the_install(build, tmp_path, monkeypatch):
    c = build("gpt2")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ImportError, match=r"needs transformers \(for the tokenizer files\).*pip install transformers"):
        c.ours.export(tmp_path / "out", format="huggingface")
    assert list(tmp_path.iterdir()) == []
    c.ours.preprocessor, preprocessor = None, c.ours.preprocessor  # no tokenizer: nothing of transformers is needed
    try:
        out = c.ours.export(tmp_path / "weights", format="huggingface")
    finally:
        c.ours.preprocessor = preprocessor
    monkeypatch.undo()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    mine, peer = logits_pair("gpt2", c.ours, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)


# Run as `python -c IMPORTS out_dir` on the backend under test: export a Llama with its tokenizer, and a mixture of
# experts (Qwen3-MoE's layout), and print which of torch's and transformers' model modules the process holds after.
IMPORTS = """
import json, sys
import keras_transformer as kt
lm = kt.models.CausalLM.from_preset("llama_stdlib")
lm.export(sys.argv[1] + "/llama", format="huggingface")
moe = dict(num_experts=4, top_k=2, intermediate_dim=8)
backbone = kt.models.LlamaBackbone(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
                                   query_key_norm="head", mixture_of_experts=moe)
kt.models.LlamaCausalLM(backbone).export(sys.argv[1] + "/moe", format="huggingface")
names = ("torch", "transformers.modeling_utils", "transformers.configuration_utils")
print("MODULES " + json.dumps({name: name in sys.modules for name in names}))
"""


def test_export_imports_no_torch_or_model_classes(tmp_path):
    """The export writes the config and the weights itself, a mixture of experts' one tensor per expert: it imports
    neither torch (which the PyTorch backend holds anyway) nor transformers' configuration and model classes, whose
    imports alone took a TensorFlow process past 3x the weights of a 135M model (benchmarks/RESULTS.md, "Hugging Face
    export on TensorFlow within 3x"). transformers reads both folders back."""
    result = subprocess.run([sys.executable, "-c", IMPORTS, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    modules = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("MODULES "))[8:])
    assert modules == {
        "torch": keras.config.backend() == "torch",
        "transformers.modeling_utils": False,
        "transformers.configuration_utils": False,
    }
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").config.model_type == "llama"
    moe = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "moe")
    assert type(moe).__name__ == "Qwen3MoeForCausalLM" and moe.config.num_experts == 4


def test_existing_folder_needs_overwrite(build, tmp_path):
    c = build("gpt2")
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="overwrite=True"):
        c.ours.export(target, format="huggingface")
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    c.ours.export(target, format="huggingface", overwrite=True)
    assert not (target / "keep.txt").exists() and (target / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_interrupted_export_leaves_nothing(build, tmp_path, monkeypatch):
    c = build("gpt2")

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_tokenizer, "save_tokenizer", fail)  # after the weights are written
    with pytest.raises(KeyboardInterrupt):
        c.ours.export(tmp_path / "out", format="huggingface")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "out").mkdir()  # an interrupted overwrite keeps the old folder as it was
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(KeyboardInterrupt):
        c.ours.export(tmp_path / "out", format="huggingface", overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in (tmp_path / "out").iterdir()] == [
        "keep.txt"
    ]


# --- the trained presets --------------------------------------------------------

PRESETS = {
    "gpt_stdlib": "AutoModelForCausalLM",
    "llama_stdlib": "AutoModelForCausalLM",
    "bert_stdlib": "AutoModelForMaskedLM",
    "t5_reverse": "AutoModelForSeq2SeqLM",
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_trained_presets_export(preset, tmp_path, capsys):
    """transformers loads each trained preset's export with our logits, and it reads back exactly; gpt_stdlib
    goes through `keras-transformer export PRESET OUT --format huggingface`."""
    ours = export.load_preset_task(preset)
    out = tmp_path / "out"
    if preset == "gpt_stdlib":
        assert cli.main(["export", preset, str(out), "--format", "huggingface"]) == 0
        assert "huggingface" in capsys.readouterr().out
    else:
        ours.export(out, format="huggingface")
    theirs = getattr(transformers, PRESETS[preset]).from_pretrained(out, attn_implementation="eager").eval()
    name = {"gpt_stdlib": "gpt2", "llama_stdlib": "llama", "bert_stdlib": "bert", "t5_reverse": "t5"}[preset]
    mine, peer = logits_pair(name, ours, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    assert np.std(peer) > 0.1
    assert_same_weights(ours, type(ours).from_preset(out))
