"""Export to the Hugging Face format (`format="huggingface"`), checked with `transformers` itself.

Each case (hf_export_cases.py) starts from a random `transformers` model saved locally, converted in with
`from_preset` (ours) and exported back out. `transformers`' Auto classes load the export; their logits,
generated tokens and tokenizer must be ours, and the exported tensors must be the original checkpoint's,
bit for bit. The options, weights in other states and bad input: test_hf_export_options.py.
"""

import json

import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import BertClassifier, BertTextClassifierPreprocessor
from keras_transformer.samplers import BeamSampler
from tests.convert.hf_export_cases import (
    ATOL,
    CAUSAL,
    CHAT_TEMPLATE,
    NEW_TOKENS,
    TEXTS,
    as_torch,
    assert_same_config_files,
    assert_same_weights,
    logits_pair,
    tensors,
)


# --- transformers agrees --------------------------------------------------------


def test_transformers_logits_match(case):
    name, c = case
    mine, peer = logits_pair(name, c.ours, c.theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    assert np.std(peer) > 0.1  # far from the tolerance: not a vacuous match


def test_folder_is_what_save_pretrained_writes(case):
    """The same files, architecture and tensor names as transformers' own save of the original model; config.json
    and generation_config.json, which we write without transformers, read by transformers as its own."""
    name, c = case
    reference = c.out.parent / "reference"
    if not reference.exists():
        c.peer.save_pretrained(reference)
    assert {p.name for p in reference.iterdir()} <= {p.name for p in c.out.iterdir()}
    assert_same_config_files(name, c.out, reference)
    assert sorted(tensors(c.out)) == sorted(tensors(reference))
    assert (c.out / "tokenizer.json").is_file() and (c.out / "tokenizer_config.json").is_file()


def _peer_generate(model, prompt, **kwargs):
    with torch.no_grad():
        out = model.generate(
            as_torch([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            do_sample=False,
            **kwargs,
        )
    return out[0].tolist()


@pytest.mark.parametrize("name,num_beams", [(name, 1) for name in CAUSAL] + [("llama", 4)])
def test_causal_generate_matches(build, name, num_beams):
    """Greedy on every causal layout (Qwen2 and Mistral past their window of 4), beam-4 on Llama."""
    c = build(name)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, c.ours.backbone.vocabulary_size, n).tolist() for n in (6, 3)]
    sampler = BeamSampler(num_beams=4) if num_beams > 1 else None
    ours = c.ours.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    extra = (
        dict(num_beams=4, length_penalty=sampler.length_penalty, early_stopping=sampler.early_stopping)
        if sampler
        else {}
    )
    for prompt, row in zip(prompts, ours):
        assert row == _peer_generate(c.theirs, prompt, **extra)
        assert len(set(row[len(prompt) :])) >= 2  # not one repeated token


@pytest.mark.parametrize("num_beams", [1, 4])
def test_t5_generate_matches(build, num_beams):
    c = build("t5_v1_1")
    rng = np.random.default_rng(2)
    sources = [rng.integers(3, c.ours.backbone.vocabulary_size, n).tolist() + [1] for n in (9, 4)]
    sampler = BeamSampler(num_beams=4) if num_beams > 1 else None
    ours = c.ours.generate(sources, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    extra = (
        dict(num_beams=4, length_penalty=sampler.length_penalty, early_stopping=sampler.early_stopping)
        if sampler
        else {}
    )
    for source, row in zip(sources, ours):
        assert row == _peer_generate(c.theirs, source, **extra)
    assert ours[0] != ours[1]


def test_bert_classifier_exports_its_head(build, tmp_path):
    c = build("bert")
    tokenizer = c.ours.preprocessor.tokenizer
    classifier = BertClassifier(
        c.ours.backbone, num_classes=3, preprocessor=BertTextClassifierPreprocessor(tokenizer, sequence_length=64)
    )
    rng = np.random.default_rng(3)
    head = classifier.output_dense
    head.kernel.assign(rng.normal(size=head.kernel.shape).astype("float32"))
    head.bias.assign(rng.normal(size=head.bias.shape).astype("float32"))
    out = classifier.export(tmp_path / "cls", format="huggingface")
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert theirs.config.num_labels == 3
    mine, peer = logits_pair("bert", classifier, theirs)
    np.testing.assert_allclose(mine, peer, atol=ATOL, rtol=0)
    assert_same_weights(classifier, BertClassifier.from_preset(out))  # the pooler and the head come back too


# --- round trips ----------------------------------------------------------------


def test_hugging_face_to_preset_to_hugging_face_is_exact(case):
    """Every exported tensor is the original checkpoint's; the original's extra tensors are tied copies
    (T5 v1.1 was written as transformers 4 did, with the embedding copies)."""
    name, c = case
    original, exported = tensors(c.source), tensors(c.out)
    assert set(exported) <= set(original)
    for key, tensor in exported.items():
        assert torch.equal(tensor, original[key]), key
    for key in set(original) - set(exported):
        assert (
            name == "t5_v1_1"
            and key.endswith("embed_tokens.weight")
            and torch.equal(original[key], exported["shared.weight"])
        )


def test_preset_to_hugging_face_to_preset_is_exact(case):
    name, c = case
    assert_same_weights(c.ours, type(c.ours).from_preset(c.out))


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
        role: token for role, token in tokenizer.special_tokens.items()
    }
    with_special = theirs(texts)["input_ids"]
    if name in CAUSAL:
        assert with_special == c.ours.preprocessor.generate_preprocess(texts)
    elif name.startswith("t5"):
        ids, mask = c.ours.preprocessor.generate_preprocess(texts)
        assert with_special == [row[m].tolist() for row, m in zip(ids, mask)]
    else:
        assert with_special == [
            [tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id] for ids in tokenizer.tokenize(texts)
        ]


def test_chat_template_agrees(build):
    c = build("llama")
    theirs = transformers.AutoTokenizer.from_pretrained(c.out)
    tokenizer = c.ours.preprocessor.tokenizer
    messages = [
        {"role": "user", "content": "the quick brown fox"},
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": "def add(a, b)"},
    ]
    text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert text.startswith("<s>user: ")  # the template ran, with the special tokens filled in
    # In tokenizer_config.json, where every transformers release reads it (older ones know no chat_template.jinja).
    assert json.loads((c.out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert theirs(text, add_special_tokens=False)["input_ids"] == tokenizer.tokenize([text])[0]
