"""The BERT-layout shape presets of real checkpoints: roberta_base, xlm_roberta_base and the sentence embedders
all_minilm_l6_v2 and bge_small (tools/build_presets.py).

Each preset's backbone is what the converter makes of its checkpoint's published config.json (written here with
transformers' config classes, nothing downloaded), with as many parameters as transformers' model of that config
(built on the meta device); its tokenizer has the checkpoint's layout.
"""

import inspect

import numpy as np
import pytest
import torch
import transformers

import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.convert import hf_bert
from keras_transformer.models import BertBackbone, BertTextEmbedder, TextEmbedder
from keras_transformer.tokenizers import Tokenizer

_ROBERTA = dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0)
# preset -> (the config.json of the checkpoint it names, its hf:// handle, the sentence-transformers settings)
CHECKPOINTS = {
    "roberta_base": (
        transformers.RobertaConfig(vocab_size=50265, eos_token_id=2, **_ROBERTA),
        "hf://FacebookAI/roberta-base",
        None,
    ),
    "xlm_roberta_base": (
        transformers.XLMRobertaConfig(vocab_size=250002, eos_token_id=2, **_ROBERTA),
        "hf://FacebookAI/xlm-roberta-base",
        None,
    ),
    "all_minilm_l6_v2": (
        transformers.BertConfig(hidden_size=384, num_hidden_layers=6, intermediate_size=1536),
        "hf://sentence-transformers/all-MiniLM-L6-v2",
        {"pooling": "mean", "normalize": True, "sequence_length": 256},
    ),
    "bge_small": (
        transformers.BertConfig(hidden_size=384, intermediate_size=1536),
        "hf://BAAI/bge-small-en-v1.5",
        {"pooling": "cls", "normalize": True, "sequence_length": 512},
    ),
}


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_preset_has_the_shape_and_parameters_of_its_checkpoint(name):
    hf_config, handle, embedder = CHECKPOINTS[name]
    row = {row["name"]: row for row in kt.list_presets()}[name]
    assert row["family"] == "bert" and handle in row["description"]
    _, preset = presets.load_config(name)
    converted = hf_bert.convert_config(hf_config.to_dict())["backbone"]["config"]
    defaults = inspect.signature(BertBackbone).parameters
    assert {key: preset["backbone"]["config"].get(key, defaults[key].default) for key in converted} == converted
    with torch.device("meta"):
        counted = sum(p.numel() for p in transformers.AutoModel.from_config(hf_config).parameters())
    assert preset["parameter_count"] == counted
    if embedder is not None:  # the pooling its sentence-transformers folder's modules.json and 1_Pooling say
        assert preset["task"] == {
            "class_name": "BertTextEmbedder",
            "config": {k: embedder[k] for k in ("pooling", "normalize")},
        }
        assert preset["preprocessor"]["config"]["sequence_length"] == embedder["sequence_length"]


@pytest.mark.parametrize("name", ["roberta_base", "xlm_roberta_base"])
def test_roberta_tokenizers_have_roberta_layout(name):
    """<s> <pad> </s> <unk> as ids 0-3 and <mask> last (taking the space before it); the tokenizer's own template
    packs a pair as roberta-base's does, <s> a </s></s> b </s>, which the encoder bundle reads."""
    tokenizer = Tokenizer.load(presets.resolve(name))
    roles = ("bos_token_id", "pad_token_id", "eos_token_id", "unk_token_id", "mask_token_id")
    assert [getattr(tokenizer, role) for role in roles] == [0, 1, 2, 3, tokenizer.vocabulary_size - 1]
    assert (tokenizer.cls_token_id, tokenizer.sep_token_id) == (0, 2)
    assert tokenizer.tokenize("a <mask>") == tokenizer.tokenize("a") + [tokenizer.mask_token_id]
    a, b = tokenizer.tokenize("def add(a, b):"), tokenizer.tokenize("the house")
    assert tokenizer.backend_tokenizer.encode("def add(a, b):", "the house").ids == [0, *a, 2, 2, *b, 2]


def test_embedder_preset_embeds():
    """all_minilm_l6_v2 builds as a BertTextEmbedder (random weights) whose embeddings have unit norm."""
    embedder = TextEmbedder.from_preset("all_minilm_l6_v2")
    assert type(embedder) is BertTextEmbedder and (embedder.pooling, embedder.normalize) == ("mean", True)
    embeddings = embedder.predict(["def add(a, b):", "the house is small"], batch_size=2, verbose=0)
    assert embeddings.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-5)
