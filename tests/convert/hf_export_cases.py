"""The cases of the Hugging Face export tests (test_hf_export.py, test_hf_export_options.py): small random
`transformers` checkpoints saved locally (hf_models.py), converted in with `from_preset` (ours), exported back
out and loaded by `transformers`' Auto classes; the inputs and the logits both sides give.
Axes: B batch, T length, P masked positions, V vocabulary.
"""

import json

import numpy as np
import torch
import transformers
from safetensors import safe_open

from keras_transformer.models import (
    BertClassifier,
    BertMaskedLM,
    GemmaCausalLM,
    GPTCausalLM,
    LlamaCausalLM,
    T5Seq2SeqLM,
)
from tests.conftest import to_numpy
from tests.convert import hf_models

ATOL = 1e-4
NEW_TOKENS = 8
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# Gemma 3's two rotary bases: the sliding layers' (10), the global layers' (1000, linear scaling by 2). (Its case
# has an untied head: a random tied Gemma mostly repeats its last token, which would leave greedy search untested.)
GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
    "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
}
# Gemma 2's one rotary embedding and its soft caps (strong ones: the tanh bends the logits well past the tolerance).
GEMMA2_OPTIONS = dict(
    rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    attn_logit_softcapping=1.5,
    final_logit_softcapping=3.0,
)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}"
)
# name -> (builder of the transformers checkpoint, our task class, transformers' Auto class). T5 v1.0's
# tied, scaled head is the trained preset t5_reverse's (test_trained_presets_export).
CASES = {
    "gpt2": (lambda d: hf_models.gpt2(d), GPTCausalLM, "AutoModelForCausalLM"),
    "llama": (
        lambda d: hf_models.llama_style(
            d, "llama", head_dim=16, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3
        ),
        LlamaCausalLM,
        "AutoModelForCausalLM",
    ),
    "qwen2": (
        lambda d: hf_models.llama_style(
            d, "qwen2", tie_word_embeddings=True, use_sliding_window=True, sliding_window=4, max_window_layers=0
        ),
        LlamaCausalLM,
        "AutoModelForCausalLM",
    ),
    "mistral": (lambda d: hf_models.llama_style(d, "mistral", sliding_window=4), LlamaCausalLM, "AutoModelForCausalLM"),
    "qwen3": (
        lambda d: hf_models.llama_style(
            d, "qwen3", head_dim=16, use_sliding_window=True, sliding_window=4, max_window_layers=1
        ),
        LlamaCausalLM,
        "AutoModelForCausalLM",
    ),
    "smollm3": (
        lambda d: hf_models.llama_style(d, "smollm3", no_rope_layers=[1, 0], attention_bias=True, mlp_bias=True),
        LlamaCausalLM,
        "AutoModelForCausalLM",
    ),
    "gemma3": (
        lambda d: hf_models.gemma(d, rope_parameters=GEMMA3_ROPE, tie_word_embeddings=False),
        GemmaCausalLM,
        "AutoModelForCausalLM",
    ),
    "gemma2": (lambda d: hf_models.gemma(d, "gemma2", **GEMMA2_OPTIONS), GemmaCausalLM, "AutoModelForCausalLM"),
    "bert": (lambda d: hf_models.bert(d, "BertForMaskedLM"), BertMaskedLM, "AutoModelForMaskedLM"),
    "t5_v1_1": (
        lambda d: hf_models.t5(d, untied_head=True, feed_forward_proj="gated-gelu"),
        T5Seq2SeqLM,
        "AutoModelForSeq2SeqLM",
    ),
}
CAUSAL = ("gpt2", "llama", "qwen2", "mistral", "qwen3", "smollm3", "gemma3", "gemma2")
TEXTS = ["the quick brown fox", "def add(a, b):\n    return a + b", "a cat sat on the mat and looked at the dog"]


class Case:
    def __init__(self, source, peer, ours, out, theirs):
        self.source, self.peer, self.ours, self.out, self.theirs = source, peer, ours, out, theirs


def tensors(directory):
    arrays = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            arrays.update({name: f.get_tensor(name) for name in f.keys()})
    return arrays


def _causal_inputs(vocabulary_size):
    rng = np.random.default_rng(0)
    mask = np.arange(12)[None, :] < np.array([[12], [7], [3]])  # (B, T), right-padded
    return {
        "token_ids": np.where(mask, rng.integers(1, vocabulary_size, (3, 12)), 0).astype("int32"),
        "padding_mask": mask,
    }


def _t5_inputs(vocabulary_size):
    rng = np.random.default_rng(0)
    enc = np.arange(13)[None, :] < np.array([[13], [7], [10]])
    dec = np.arange(9)[None, :] < np.array([[9], [4], [6]])
    decoder_ids = np.where(dec, rng.integers(3, vocabulary_size, (3, 9)), 0).astype("int32")
    decoder_ids[:, 0] = 0  # the decoder start token (= pad)
    return {
        "encoder_token_ids": np.where(enc, rng.integers(3, vocabulary_size, (3, 13)), 0).astype("int32"),
        "encoder_padding_mask": enc,
        "decoder_token_ids": decoder_ids,
        "decoder_padding_mask": dec,
    }


def _bert_inputs(vocabulary_size):
    rng = np.random.default_rng(0)
    mask = np.arange(11)[None, :] < np.array([[11], [7], [3]])
    segments = (np.arange(11)[None, :] >= np.array([[6], [3], [1]])).astype("int32")
    return {
        "token_ids": np.where(mask, rng.integers(5, vocabulary_size, (3, 11)), 0).astype("int32"),
        "segment_ids": np.where(mask, segments, 0).astype("int32"),
        "padding_mask": mask,
    }


def as_torch(array):
    return torch.tensor(np.asarray(array), dtype=torch.long)


def logits_pair(name, ours, theirs):
    """(our logits, transformers' logits) on the real positions of one padded batch."""
    vocabulary_size = ours.backbone.vocabulary_size
    with torch.no_grad():
        if name.startswith("t5"):
            x = _t5_inputs(vocabulary_size)
            peer = theirs(
                input_ids=as_torch(x["encoder_token_ids"]),
                attention_mask=as_torch(x["encoder_padding_mask"]),
                decoder_input_ids=as_torch(x["decoder_token_ids"]),
                decoder_attention_mask=as_torch(x["decoder_padding_mask"]),
            ).logits.numpy()
            real = x["decoder_padding_mask"]
            return to_numpy(ours(x))[real], peer[real]
        if name.startswith("bert"):
            x = _bert_inputs(vocabulary_size)
            peer = theirs(
                input_ids=as_torch(x["token_ids"]),
                token_type_ids=as_torch(x["segment_ids"]),
                attention_mask=as_torch(x["padding_mask"]),
            ).logits.numpy()
            if isinstance(ours, BertClassifier):
                return to_numpy(ours(x)), peer  # (B, C)
            positions = np.array([[0, 5, 10], [1, 6, 3], [2, 1, 0]], "int32")  # (B, P), real positions
            mine = to_numpy(ours({**x, "mask_positions": positions}))  # (B, P, V)
            return mine, np.take_along_axis(peer, positions[:, :, None], axis=1)
        x = _causal_inputs(vocabulary_size)
        peer = theirs(input_ids=as_torch(x["token_ids"]), attention_mask=as_torch(x["padding_mask"])).logits.numpy()
        real = x["padding_mask"]
        return to_numpy(ours(x))[real], peer[real]


def assert_same_weights(ours, back):
    """Bit for bit, but for BertMaskedLM's pooler: BertForMaskedLM has none (the masked-LM logits do not use it)."""
    pairs = list(zip(ours.weights, back.weights, strict=True))
    for a, b in pairs:
        if not (isinstance(ours, BertMaskedLM) and "pooled_dense" in a.path):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)


def assert_same_config_files(name, out, reference):
    """config.json and generation_config.json of our export `out`, which we write without transformers, against
    transformers' own save `reference` of the same model: each entry we write is theirs, and transformers reads both
    files alike (an entry we leave out is its class default, which its save spells out)."""
    readers = {"config.json": transformers.AutoConfig, "generation_config.json": transformers.GenerationConfig}
    for file, reader in readers.items():
        if (reference / file).exists():
            ours, theirs = (json.loads((d / file).read_text()) for d in (out, reference))
            _assert_same_config(name, ours, {key: theirs[key] for key in ours if key in theirs}, raw=True)
            _assert_same_config(name, *(reader.from_pretrained(d).to_dict() for d in (out, reference)), raw=False)


def _assert_same_config(name, ours, theirs, raw):
    """Every entry of transformers' config.json (or generation_config.json) is ours, but for what differs by design:
    special-token ids are our tokenizer's (it pads with its end token; Qwen2's has no start token), a default may be
    spelt out (n_inner, head_dim, n_positions), the version that wrote it, and the entries transformers 4 reads
    instead of 5's (torch_dtype, rope_theta, rope_scaling; T5 v1.1's tie_word_embeddings=false, which 4 reads as its
    own head; Qwen3-MoE's num_experts), equal to 5's. `raw`: the files' entries, else the configs transformers reads
    from them."""
    transformers4 = {"torch_dtype", "rope_theta", "rope_scaling", "rope_local_base_freq"}
    transformers4 |= {"t5_v1_1": {"tie_word_embeddings"}, "qwen3_moe": {"num_experts"}}.get(name, set())
    for key in sorted(set(ours) | set(theirs)):
        if key in {
            "pad_token_id",
            "bos_token_id",
            "transformers_version",
            "_from_model_config",
            "_name_or_path",
        } | transformers4 or (key in ("n_inner", "head_dim", "n_positions") and theirs.get(key) is None):
            continue
        assert ours.get(key, "missing") == theirs.get(key, "missing"), key
    if "architectures" not in ours or not raw:  # generation_config.json, or the configs as read
        return
    assert ours["torch_dtype"] == theirs["dtype"]
    if isinstance(theirs.get("rope_parameters"), dict) and "rope_theta" in ours:
        rope = dict(theirs["rope_parameters"])
        if "full_attention" in rope:  # Gemma 3: the global layers' scaling, the sliding layers' base
            assert ours["rope_local_base_freq"] == rope["sliding_attention"]["rope_theta"]
            rope = dict(rope["full_attention"])
        assert ours["rope_theta"] == rope.pop("rope_theta")
        assert ours["rope_scaling"] == (None if rope["rope_type"] == "default" else rope)
    if name == "t5_v1_1":
        assert ours["tie_word_embeddings"] is False
