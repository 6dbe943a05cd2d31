"""Export to the Hugging Face format (`format="huggingface"`), checked with `transformers` itself.

Each case starts from a random `transformers` model saved locally (tests/convert/hf_models.py), converted
in with `from_preset` (ours) and exported back out. `transformers`' Auto classes load the export; their
logits and generated tokens must be ours, and the exported tensors must be the original checkpoint's,
bit for bit. Axes: B batch, T length, V vocabulary.
"""

import json
import logging
import re
import sys

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from keras_transformer import cli
from keras_transformer.convert import hf_export, hf_tokenizer
from keras_transformer.models import (
    BertClassifier, BertMaskedLM, BertTextClassifierPreprocessor, GPTCausalLM, LlamaBackbone, LlamaCausalLM, T5Seq2SeqLM, TransformerSeq2SeqLM,
)
from keras_transformer.models.lora import enable_lora
from keras_transformer.samplers import BeamSampler
from tests.conftest import to_numpy
from tests.convert import hf_models

ATOL = 1e-4
NEW_TOKENS = 8
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}")
# name -> (builder of the transformers checkpoint, our task class, transformers' Auto class). T5 v1.0's
# tied, scaled head is the trained preset t5_reverse's (test_trained_presets_export).
CASES = {
    "gpt2": (lambda d: hf_models.gpt2(d), GPTCausalLM, "AutoModelForCausalLM"),
    "llama": (lambda d: hf_models.llama_style(d, "llama", head_dim=16, attention_bias=True, mlp_bias=True,
                                              rope_parameters=LLAMA3), LlamaCausalLM, "AutoModelForCausalLM"),
    "qwen2": (lambda d: hf_models.llama_style(d, "qwen2", tie_word_embeddings=True, use_sliding_window=True,
                                              sliding_window=4, max_window_layers=0), LlamaCausalLM, "AutoModelForCausalLM"),
    "mistral": (lambda d: hf_models.llama_style(d, "mistral", sliding_window=4), LlamaCausalLM, "AutoModelForCausalLM"),
    "bert": (lambda d: hf_models.bert(d, "BertForMaskedLM"), BertMaskedLM, "AutoModelForMaskedLM"),
    "t5_v1_1": (lambda d: hf_models.t5(d, untied_head=True, feed_forward_proj="gated-gelu"), T5Seq2SeqLM,
                "AutoModelForSeq2SeqLM"),
}
CAUSAL = ("gpt2", "llama", "qwen2", "mistral")
TEXTS = ["the quick brown fox", "def add(a, b):\n    return a + b", "a cat sat on the mat and looked at the dog"]


class Case:
    def __init__(self, source, peer, ours, out, theirs):
        self.source, self.peer, self.ours, self.out, self.theirs = source, peer, ours, out, theirs


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(name) -> Case: the original checkpoint, ours converted from it, its export and transformers' load of it."""
    built = {}

    def get(name):
        if name not in built:
            make, task_cls, auto = CASES[name]
            source = tmp_path_factory.mktemp(name)
            peer = make(source)
            ours = task_cls.from_preset(source)
            if name == "llama":
                ours.preprocessor.tokenizer.chat_template = CHAT_TEMPLATE
            out = ours.export(tmp_path_factory.mktemp(name + "_hf") / "out", format="huggingface")
            theirs = getattr(transformers, auto).from_pretrained(out, attn_implementation="eager").eval()
            built[name] = Case(source, peer, ours, out, theirs)
        return built[name]

    return get


@pytest.fixture(scope="module", params=list(CASES))
def case(request, build):
    return request.param, build(request.param)


def _tensors(directory):
    arrays = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            arrays.update({name: f.get_tensor(name) for name in f.keys()})
    return arrays


def _causal_inputs(vocabulary_size):
    rng = np.random.default_rng(0)
    mask = np.arange(12)[None, :] < np.array([[12], [7], [3]])  # (B, T), right-padded
    return {"token_ids": np.where(mask, rng.integers(1, vocabulary_size, (3, 12)), 0).astype("int32"), "padding_mask": mask}


def _t5_inputs(vocabulary_size):
    rng = np.random.default_rng(0)
    enc = np.arange(13)[None, :] < np.array([[13], [7], [10]])
    dec = np.arange(9)[None, :] < np.array([[9], [4], [6]])
    decoder_ids = np.where(dec, rng.integers(3, vocabulary_size, (3, 9)), 0).astype("int32")
    decoder_ids[:, 0] = 0  # the decoder start token (= pad)
    return {"encoder_token_ids": np.where(enc, rng.integers(3, vocabulary_size, (3, 13)), 0).astype("int32"),
            "encoder_padding_mask": enc, "decoder_token_ids": decoder_ids, "decoder_padding_mask": dec}


def _bert_inputs(vocabulary_size):
    rng = np.random.default_rng(0)
    mask = np.arange(11)[None, :] < np.array([[11], [7], [3]])
    segments = (np.arange(11)[None, :] >= np.array([[6], [3], [1]])).astype("int32")
    return {"token_ids": np.where(mask, rng.integers(5, vocabulary_size, (3, 11)), 0).astype("int32"),
            "segment_ids": np.where(mask, segments, 0).astype("int32"), "padding_mask": mask}


def _t(array):
    return torch.tensor(np.asarray(array), dtype=torch.long)


def _logits_pair(name, ours, theirs):
    """(our logits, transformers' logits) on the real positions of one padded batch."""
    vocabulary_size = ours.backbone.vocabulary_size
    with torch.no_grad():
        if name.startswith("t5"):
            x = _t5_inputs(vocabulary_size)
            peer = theirs(input_ids=_t(x["encoder_token_ids"]), attention_mask=_t(x["encoder_padding_mask"]),
                          decoder_input_ids=_t(x["decoder_token_ids"]),
                          decoder_attention_mask=_t(x["decoder_padding_mask"])).logits.numpy()
            real = x["decoder_padding_mask"]
            return to_numpy(ours(x))[real], peer[real]
        if name.startswith("bert"):
            x = _bert_inputs(vocabulary_size)
            peer = theirs(input_ids=_t(x["token_ids"]), token_type_ids=_t(x["segment_ids"]),
                          attention_mask=_t(x["padding_mask"])).logits.numpy()
            if isinstance(ours, BertClassifier):
                return to_numpy(ours(x)), peer  # (B, C)
            positions = np.array([[0, 5, 10], [1, 6, 3], [2, 1, 0]], "int32")  # (B, P), real positions
            mine = to_numpy(ours({**x, "mask_positions": positions}))  # (B, P, V)
            return mine, np.take_along_axis(peer, positions[:, :, None], axis=1)
        x = _causal_inputs(vocabulary_size)
        peer = theirs(input_ids=_t(x["token_ids"]), attention_mask=_t(x["padding_mask"])).logits.numpy()
        real = x["padding_mask"]
        return to_numpy(ours(x))[real], peer[real]


# --- transformers agrees --------------------------------------------------------


def test_transformers_logits_match(case):
    name, c = case
    mine, peer = _logits_pair(name, c.ours, c.theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    assert np.std(peer) > 0.1  # far from the tolerance: not a vacuous match


def test_folder_is_what_save_pretrained_writes(case):
    """The same files, architecture and tensor names as transformers' own save of the original model."""
    name, c = case
    reference = c.out.parent / "reference"
    if not reference.exists():
        c.peer.save_pretrained(reference)
    assert {p.name for p in reference.iterdir()} <= {p.name for p in c.out.iterdir()}
    for file in ("config.json", "generation_config.json"):
        if (reference / file).exists():
            _assert_same_config(name, *(json.loads((d / file).read_text()) for d in (c.out, reference)))
    assert sorted(_tensors(c.out)) == sorted(_tensors(reference))
    assert (c.out / "tokenizer.json").is_file() and (c.out / "tokenizer_config.json").is_file()


def _assert_same_config(name, ours, theirs):
    """Every entry of transformers' own config.json (or generation_config.json) is ours, but for what
    differs by design: special-token ids are our tokenizer's (it pads with its end token; Qwen2's has
    no start token), a default may be spelt out (n_inner, head_dim, n_positions), and T5 v1.1 says
    tie_word_embeddings=false as its checkpoints do (transformers 4 reads true as v1.0's tied head)."""
    by_design = {"pad_token_id", "bos_token_id"} | ({"tie_word_embeddings"} if name == "t5_v1_1" else set())
    for key in sorted(set(ours) | set(theirs)):
        if key in by_design or (key in ("n_inner", "head_dim", "n_positions") and theirs.get(key) is None):
            continue
        assert ours.get(key, "missing") == theirs.get(key, "missing"), key
    if name == "t5_v1_1" and "architectures" in ours:  # config.json
        assert ours["tie_word_embeddings"] is False and ours["scale_decoder_outputs"] is False


def _peer_generate(model, prompt, **kwargs):
    with torch.no_grad():
        out = model.generate(_t([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0, do_sample=False, **kwargs)
    return out[0].tolist()


@pytest.mark.parametrize("name,num_beams", [(name, 1) for name in CAUSAL] + [("llama", 4)])
def test_causal_generate_matches(build, name, num_beams):
    """Greedy on every causal layout (Qwen2 and Mistral past their window of 4), beam-4 on Llama."""
    c = build(name)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, c.ours.backbone.vocabulary_size, n).tolist() for n in (6, 3)]
    sampler = BeamSampler(num_beams=4) if num_beams > 1 else None
    ours = c.ours.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    extra = dict(num_beams=4, length_penalty=sampler.length_penalty, early_stopping=sampler.early_stopping) if sampler else {}
    for prompt, row in zip(prompts, ours):
        assert row == _peer_generate(c.theirs, prompt, **extra)
        assert len(set(row[len(prompt):])) >= 2  # not one repeated token


@pytest.mark.parametrize("num_beams", [1, 4])
def test_t5_generate_matches(build, num_beams):
    c = build("t5_v1_1")
    rng = np.random.default_rng(2)
    sources = [rng.integers(3, c.ours.backbone.vocabulary_size, n).tolist() + [1] for n in (9, 4)]
    sampler = BeamSampler(num_beams=4) if num_beams > 1 else None
    ours = c.ours.generate(sources, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    extra = dict(num_beams=4, length_penalty=sampler.length_penalty, early_stopping=sampler.early_stopping) if sampler else {}
    for source, row in zip(sources, ours):
        assert row == _peer_generate(c.theirs, source, **extra)
    assert ours[0] != ours[1]


def test_bert_classifier_exports_its_head(build, tmp_path):
    c = build("bert")
    tokenizer = c.ours.preprocessor.tokenizer
    classifier = BertClassifier(c.ours.backbone, num_classes=3,
                                preprocessor=BertTextClassifierPreprocessor(tokenizer, sequence_length=64))
    rng = np.random.default_rng(3)
    head = classifier.output_dense
    head.kernel.assign(rng.normal(size=head.kernel.shape).astype("float32"))
    head.bias.assign(rng.normal(size=head.bias.shape).astype("float32"))
    out = classifier.export(tmp_path / "cls", format="huggingface")
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert theirs.config.num_labels == 3
    mine, peer = _logits_pair("bert", classifier, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    _assert_same_weights(classifier, BertClassifier.from_preset(out))  # the pooler and the head come back too


# --- round trips ----------------------------------------------------------------


def test_hugging_face_to_preset_to_hugging_face_is_exact(case):
    """Every exported tensor is the original checkpoint's; the original's extra tensors are tied copies
    (T5 v1.1 was written as transformers 4 did, with the embedding copies)."""
    name, c = case
    original, exported = _tensors(c.source), _tensors(c.out)
    assert set(exported) <= set(original)
    for key, tensor in exported.items():
        assert torch.equal(tensor, original[key]), key
    for key in set(original) - set(exported):
        assert name == "t5_v1_1" and key.endswith("embed_tokens.weight") and torch.equal(original[key], exported["shared.weight"])


def test_preset_to_hugging_face_to_preset_is_exact(case):
    name, c = case
    _assert_same_weights(c.ours, type(c.ours).from_preset(c.out))


def _assert_same_weights(ours, back):
    """Bit for bit, but for BertMaskedLM's pooler: BertForMaskedLM has none (the masked-LM logits do not use it)."""
    pairs = list(zip(ours.weights, back.weights, strict=True))
    for a, b in pairs:
        if not (isinstance(ours, BertMaskedLM) and "pooled_dense" in a.path):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)


# --- the tokenizer ---------------------------------------------------------------


def test_tokenizer_agrees(case):
    """transformers' AutoTokenizer gives our ids: without special tokens, with the ones our preprocessor
    adds, and for each special token's own string."""
    name, c = case
    theirs = transformers.AutoTokenizer.from_pretrained(c.out)
    tokenizer = c.ours.preprocessor.tokenizer
    special = [token for token in tokenizer.special_tokens.values() if token is not None]
    texts = TEXTS + [f"{special[0]} the house {special[-1]} is small"]
    assert theirs(texts, add_special_tokens=False)["input_ids"] == tokenizer.tokenize(texts)
    for role, token in tokenizer.special_tokens.items():
        if token is not None:  # a role we leave empty may get the class's default (Qwen2Tokenizer's unk)
            assert getattr(theirs, role) == token, role
            assert theirs.convert_tokens_to_ids(token) == tokenizer.token_to_id(token)
    config = json.loads((c.out / "tokenizer_config.json").read_text())
    # The class every transformers release has (5 also reads it as its TokenizersBackend); the special tokens by name.
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert {role: config.get(role) for role in tokenizer.special_tokens} == {
        role: token for role, token in tokenizer.special_tokens.items()}
    with_special = theirs(texts)["input_ids"]
    if name in CAUSAL:
        assert with_special == c.ours.preprocessor.generate_preprocess(texts)
    elif name.startswith("t5"):
        ids, mask = c.ours.preprocessor.generate_preprocess(texts)
        assert with_special == [row[m].tolist() for row, m in zip(ids, mask)]
    else:
        assert with_special == [[tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id] for ids in tokenizer.tokenize(texts)]


def test_chat_template_agrees(build):
    c = build("llama")
    theirs = transformers.AutoTokenizer.from_pretrained(c.out)
    tokenizer = c.ours.preprocessor.tokenizer
    messages = [{"role": "user", "content": "the quick brown fox"}, {"role": "assistant", "content": "a cat"},
                {"role": "user", "content": "def add(a, b)"}]
    text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert text.startswith("<s>user: ")  # the template ran, with the special tokens filled in
    # In tokenizer_config.json, where every transformers release reads it (older ones know no chat_template.jinja).
    assert json.loads((c.out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert theirs(text, add_special_tokens=False)["input_ids"] == tokenizer.tokenize([text])[0]


# --- options --------------------------------------------------------------------


def test_sharded_export_loads(build, tmp_path):
    c = build("gpt2")
    out = c.ours.export(tmp_path / "sharded", format="huggingface", max_shard_size="20KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert not (out / "model.safetensors").exists() and len(set(index["weight_map"].values())) > 1
    assert {p.name for p in out.glob("model-*.safetensors")} == set(index["weight_map"].values())
    exported = _tensors(out)
    assert set(exported) == set(index["weight_map"])
    for key, tensor in _tensors(c.out).items():
        assert torch.equal(tensor, exported[key]), key
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    mine, peer = _logits_pair("gpt2", c.ours, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_is_chosen(build, tmp_path, dtype):
    c = build("qwen2")
    out = c.ours.export(tmp_path / dtype, format="huggingface", dtype=dtype)
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype
    exported, full = _tensors(out), _tensors(c.out)
    for key, tensor in exported.items():
        assert tensor.dtype == getattr(torch, dtype), key
        assert torch.equal(tensor, full[key].to(getattr(torch, dtype))), key  # rounded once, from float32


def test_dtype_is_kept(build, tmp_path):
    """A bfloat16 model exports bfloat16 weights unless told otherwise."""
    c = build("gpt2")
    backbone = type(c.ours.backbone).from_config({**c.ours.backbone.get_config(), "dtype": "bfloat16"})
    lm = GPTCausalLM(backbone)
    lm.set_weights(c.ours.get_weights())  # rounded to bfloat16 once
    out = lm.export(tmp_path / "bf16", format="huggingface")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    full = _tensors(c.out)
    for key, tensor in _tensors(out).items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, full[key].to(torch.bfloat16)), key


def test_task_without_preprocessor(build, tmp_path):
    """No tokenizer files, no special-token ids (not GPT-2's defaults, outside this vocabulary)."""
    c = build("gpt2")
    out = GPTCausalLM(c.ours.backbone).export(tmp_path / "bare", format="huggingface")
    assert not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (None, None, None)
    for key, tensor in _tensors(out).items():
        assert torch.equal(tensor, _tensors(c.out)[key]), key


def test_lora_is_merged(build, tmp_path):
    c = build("gpt2")
    lm = GPTCausalLM.from_preset(c.source)
    enable_lora(lm.backbone, rank=2)
    rng = np.random.default_rng(4)
    for variable in lm.backbone.weights:
        if "lora_kernel" in variable.path:
            variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))
    out = lm.export(tmp_path / "lora", format="huggingface")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    mine, peer = _logits_pair("gpt2", lm, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    plain, _ = _logits_pair("gpt2", c.ours, theirs)
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
    full, quantized = _tensors(c.out), 0
    for key, tensor in _tensors(out).items():
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
    mine, peer = _logits_pair("gpt2", c.ours, theirs)  # the float model's logits, near
    assert np.abs(mine - peer).max() < 0.1 * np.abs(mine).max()


def test_int4_model_is_refused(build, tmp_path):
    c = build("gpt2")
    lm = GPTCausalLM.from_preset(c.source)
    lm.quantize("int4")
    _assert_refused(lm, tmp_path / "q", r"int4.*quantize=None")


SUPPORTED = r"\['BertClassifier', 'BertMaskedLM', 'GPTCausalLM', 'LlamaCausalLM', 'T5Seq2SeqLM'\]"


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
    backbone = LlamaBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                             attention_bias=True, sliding_window=4)  # Llama's biases with Mistral's window
    _assert_refused(LlamaCausalLM(backbone), tmp_path / "l", r"sliding_window=4.*" + SUPPORTED)


def test_bad_options_are_refused(build, tmp_path):
    c = build("gpt2")
    _assert_refused(c.ours, tmp_path / "d", r"dtype='int8'", dtype="int8")
    _assert_refused(c.ours, tmp_path / "s", r"max_shard_size=0", max_shard_size=0)
    with pytest.raises(ValueError, match=r"quantize=None"):
        c.ours.export(tmp_path / "q", format="huggingface", quantize="int8")
    assert not (tmp_path / "q").exists()


def test_missing_transformers_names_the_install(build, tmp_path, monkeypatch):
    c = build("gpt2")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ImportError, match=r"needs `transformers` and `torch`.*pip install transformers"):
        c.ours.export(tmp_path / "out", format="huggingface")
    assert list(tmp_path.iterdir()) == []


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


# --- the trained presets --------------------------------------------------------

PRESETS = {"gpt_stdlib": "AutoModelForCausalLM", "llama_stdlib": "AutoModelForCausalLM",
           "bert_stdlib": "AutoModelForMaskedLM", "t5_reverse": "AutoModelForSeq2SeqLM"}


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_trained_presets_export(preset, tmp_path, capsys):
    """transformers loads each trained preset's export with our logits, and it reads back exactly; gpt_stdlib
    goes through `keras-transformer export PRESET OUT --format huggingface`."""
    from keras_transformer import export

    ours = export.load_preset_task(preset)
    out = tmp_path / "out"
    if preset == "gpt_stdlib":
        assert cli.main(["export", preset, str(out), "--format", "huggingface"]) == 0
        assert "huggingface" in capsys.readouterr().out
    else:
        ours.export(out, format="huggingface")
    theirs = getattr(transformers, PRESETS[preset]).from_pretrained(out, attn_implementation="eager").eval()
    name = {"gpt_stdlib": "gpt2", "llama_stdlib": "llama", "bert_stdlib": "bert", "t5_reverse": "t5"}[preset]
    mine, peer = _logits_pair(name, ours, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    assert np.std(peer) > 0.1
    _assert_same_weights(ours, type(ours).from_preset(out))
