"""ModernBERT checkpoints (`ModernBertForMaskedLM`) -> ModernBertMaskedLM, against `transformers`, and back out with
`export(format="huggingface")`; the ONNX encoder bundle; training.

The peer is a random model saved locally (hf_models.modernbert: 3 layers, global / local / global, a local window
of 2 positions each side, shorter than the test texts, rotary bases 160000 and 10, a byte-level BPE tokenizer with
ModernBERT's [CLS] [SEP] [MASK] specials after its vocabulary). Ours load it with `MaskedLM.from_preset`, which must
pick ModernBertMaskedLM. transformers runs its eager attention (padding masked; no unpadding).

Axes: B batch, T length, P masked positions, V vocabulary.
"""

import inspect
import json
import shutil

import keras
import numpy as np
import pytest
import torch
import transformers

from keras_transformer import presets
from keras_transformer.convert import hf_modernbert
from keras_transformer.models import MaskedLM, ModernBertBackbone, ModernBertMaskedLM, ModernBertMaskedLMPreprocessor
from keras_transformer.models.modernbert.modernbert_backbone import default_layer_types
from keras_transformer.tokenizers import Tokenizer
from tests.conftest import to_numpy
from tests.convert import hf_models

TEXTS = ["the quick brown fox", "a cat sat on the mat and looked at the dog", "def add(a, b):"]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    directory = tmp_path_factory.mktemp("modernbert")
    peer = hf_models.modernbert(directory).eval()
    return directory, peer, MaskedLM.from_preset(directory)


def _inputs(ours, texts):
    """Our inputs for `texts` ([CLS] text [SEP], right-padded: no segment ids) and three positions per row."""
    x, positions = hf_models.masked_lm_inputs(ours, texts)
    x.pop("segment_ids")
    return x, positions


def _their_logits(model, x, positions):
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
        ).logits.numpy()  # (B, T, V)
    return np.take_along_axis(logits, positions[:, :, None], axis=1)


def test_logits_match_transformers(case):
    """Padded (three lengths) and unpadded batches; the backbone's hidden states too."""
    _, peer, ours = case
    assert type(ours) is ModernBertMaskedLM
    assert ours.backbone.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    x, positions = _inputs(ours, TEXTS)
    assert len(set(x["padding_mask"].sum(1).tolist())) > 1  # padded rows
    assert x["padding_mask"].sum(1).min() > 2 * 2 + 1  # every row longer than the local window
    expected = _their_logits(peer, x, positions)
    np.testing.assert_allclose(to_numpy(ours({**x, "mask_positions": positions})), expected, atol=1e-4)
    assert np.std(expected) > 0.1
    unpadded, _ = _inputs(ours, TEXTS[1:2])
    assert unpadded["padding_mask"].all()
    expected = _their_logits(peer, unpadded, positions[1:2])
    np.testing.assert_allclose(to_numpy(ours({**unpadded, "mask_positions": positions[1:2]})), expected, atol=1e-4)
    with torch.no_grad():
        states = peer.model(
            input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
        ).last_hidden_state.numpy()
    mine = to_numpy(ours.backbone(x)["sequence_output"])
    np.testing.assert_allclose(mine[x["padding_mask"]], states[x["padding_mask"]], atol=1e-4)


def test_tokenizer_matches_transformers(case):
    directory, _, ours = case
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer = ours.preprocessor.tokenizer
    assert tokenizer.mask_token_id == theirs.mask_token_id and tokenizer.pad_token_id == theirs.pad_token_id
    for text in [*TEXTS, "the quick [MASK] fox", "  spaces\tand\nlines  "]:
        assert [tokenizer.cls_token_id, *tokenizer.tokenize(text), tokenizer.sep_token_id] == theirs(text)["input_ids"]


def test_hugging_face_export_round_trip(case, tmp_path):
    """Exported as ModernBertForMaskedLM: transformers reads it and gives the same logits; every tensor of the
    original comes back bit for bit; config.json also has the Hub's spelling (transformers 4's)."""
    _, peer, ours = case
    out = ours.export(tmp_path / "hf", format="huggingface")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForMaskedLM"]
    assert (config["global_attn_every_n_layers"], config["global_rope_theta"], config["local_rope_theta"]) == (
        2,
        160000.0,
        10.0,
    )
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    exported = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
    for name, value in peer.state_dict().items():
        np.testing.assert_array_equal(exported[name], value.numpy(), err_msg=name)
    x, positions = _inputs(ours, TEXTS)
    expected = _their_logits(theirs, x, positions)
    np.testing.assert_allclose(to_numpy(ours({**x, "mask_positions": positions})), expected, atol=1e-4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(TEXTS[0])["input_ids"] == x["token_ids"][0, : x["padding_mask"][0].sum()].tolist()


def test_converted_to_our_preset_format_it_loads_the_same(case, tmp_path):
    """`convert` (the `keras-transformer convert` command) writes our preset; it loads as a ModernBertMaskedLM with
    the same logits and preprocessor."""
    from keras_transformer.convert import convert

    directory, _, ours = case
    convert(directory, tmp_path / "preset")
    again = MaskedLM.from_preset(tmp_path / "preset")
    assert type(again) is ModernBertMaskedLM and type(again.preprocessor) is ModernBertMaskedLMPreprocessor
    x, positions = _inputs(ours, TEXTS)
    np.testing.assert_array_equal(
        to_numpy(again({**x, "mask_positions": positions})), to_numpy(ours({**x, "mask_positions": positions}))
    )


def test_the_hub_spelling_of_the_config_converts_the_same(case):
    """The Hub's config.json (global_attn_every_n_layers, global_rope_theta, local_rope_theta: transformers 4's
    spelling) gives the model transformers 5's spelling (layer_types, rope_parameters) gives; a null local base is
    the global one."""
    directory, _, _ = case
    config = json.loads((directory / "config.json").read_text())
    hub = {key: value for key, value in config.items() if key not in ("layer_types", "rope_parameters")}
    hub.update(global_attn_every_n_layers=2, global_rope_theta=160000.0, local_rope_theta=10.0)
    assert hf_modernbert.convert_config(hub) == hf_modernbert.convert_config(config)
    backbone = hf_modernbert.convert_config({**hub, "local_rope_theta": None})["backbone"]["config"]
    assert backbone["local_rope_max_wavelength"] == backbone["global_rope_max_wavelength"] == 160000.0
    del hub["global_attn_every_n_layers"]  # transformers' default: every third layer global, from the first
    default = hf_modernbert.convert_config(hub)["backbone"]["config"]
    assert default["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]


def test_what_modernbert_does_not_have_is_refused(case, tmp_path):
    directory, _, _ = case
    for change, match in (
        ({"norm_bias": True}, "norm_bias=True"),
        ({"hidden_activation": "gelu_fast"}, "hidden_activation='gelu_fast'"),
        ({"architectures": ["ModernBertForSequenceClassification"]}, "ModernBertForSequenceClassification"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "rope_type"),
        ({"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "chunked_attention"),
        ({"mlp_dropout": 0.1}, "mlp_dropout=0.1"),
        ({"head_dim": 16}, "head_dim=16"),
    ):
        copy = tmp_path / str(len(list(tmp_path.iterdir())))
        shutil.copytree(directory, copy)
        hf_models.edit_config(copy, **change)
        with pytest.raises(ValueError, match=match):
            MaskedLM.from_preset(copy)
    with pytest.raises(ValueError, match="layer_types"):
        ModernBertBackbone(100, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8, layer_types=["local"] * 2)


def test_the_modernbert_base_preset_has_modernbert_base_shape():
    """The preset's backbone is what the converter makes of transformers' default ModernBertConfig (ModernBERT-base's
    shape), with as many parameters as transformers' ModernBertModel; its tokenizer packs and masks as ModernBERT's
    ([CLS] text [SEP], a [MASK] that takes the space before it)."""
    hf_config = transformers.ModernBertConfig(architectures=["ModernBertForMaskedLM"]).to_dict()
    converted = hf_modernbert.convert_config(hf_config)["backbone"]["config"]
    _, preset = presets.load_config("modernbert_base")
    defaults = inspect.signature(ModernBertBackbone).parameters
    ours = {name: preset["backbone"]["config"].get(name, defaults[name].default) for name in converted}
    ours["layer_types"] = ours["layer_types"] or default_layer_types(ours["num_layers"])
    assert ours == converted
    with torch.device("meta"):
        counted = sum(p.numel() for p in transformers.ModernBertModel(transformers.ModernBertConfig()).parameters())
    assert preset["parameter_count"] == counted
    tokenizer = Tokenizer.load(presets.resolve("modernbert_base"))
    assert tokenizer.tokenize("a [MASK]") == tokenizer.tokenize("a") + [tokenizer.mask_token_id]
    x, _, _ = ModernBertMaskedLMPreprocessor(tokenizer, sequence_length=16, seed=0)(["def add(a, b):"])
    row = x["token_ids"][0, : x["padding_mask"][0].sum()]
    assert row[0] == tokenizer.cls_token_id and row[-1] == tokenizer.sep_token_id and len(row) > 4


def test_fit_lowers_the_loss(case):
    """A few steps on one batch (its masks drawn once) lower the masked-LM loss."""
    directory, _, _ = case
    ours = MaskedLM.from_preset(directory)
    x, y, w = ours.preprocessor(hf_models.TEXTS[:8])
    assert sorted(x) == ["mask_positions", "padding_mask", "token_ids"]
    # The task's loss (from logits); on TensorFlow without XLA, whose compile on a CPU costs more than these steps.
    jit_compile = False if keras.config.backend() == "tensorflow" else "auto"
    ours.compile(optimizer=keras.optimizers.Adam(1e-3), weighted_metrics=[], jit_compile=jit_compile)
    # One batch per epoch: each epoch's loss is that of the weights before its step (the first: the checkpoint's).
    losses = ours.fit(x, y, sample_weight=w, batch_size=8, epochs=4, verbose=0).history["loss"]
    assert np.isfinite(losses[-1]) and losses[-1] < losses[0] - 0.1


@pytest.mark.slow
@pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="both exports trace the model under TensorFlow whatever the backend (a TensorFlow child process here, "
    "tested for every family in tests/export/): the TensorFlow run checks these graphs, against transformers too",
)
def test_the_onnx_bundle_and_the_saved_model(case, tmp_path):
    """The encoder bundle (its graph traced by tf2onnx, with no segment_ids input) fills [MASK] as Keras and
    transformers do; the SavedModel's serving signature gives the same logits."""
    import tensorflow as tf

    from keras_transformer.bundle_runtime import load_bundle_runtime

    _, peer, ours = case
    bundle = ours.export(tmp_path / "bundle", format="onnx")
    saved = ours.export(tmp_path / "saved", format="tf_saved_model")
    encoder = load_bundle_runtime(bundle).Encoder(bundle)
    assert [i.name for i in encoder.session.get_inputs()] == ["token_ids", "padding_mask", "mask_positions"]
    texts = ["the quick [MASK] fox jumps over the lazy dog", "a cat sat on the [MASK]"]
    feeds = encoder.pack(texts)
    tokenizer = ours.preprocessor.tokenizer
    positions = np.argwhere(feeds["token_ids"] == tokenizer.mask_token_id)[:, 1].reshape(2, 1).astype("int32")
    inputs = {"token_ids": feeds["token_ids"].astype("int32"), "padding_mask": feeds["padding_mask"].astype(bool)}
    keras_logits = to_numpy(ours({**inputs, "mask_positions": positions}))
    np.testing.assert_allclose(encoder(texts)["logits"], keras_logits, atol=1e-4)
    np.testing.assert_allclose(keras_logits, _their_logits(peer, inputs, positions), atol=1e-4)
    served = tf.saved_model.load(str(saved)).signatures["serving_default"]
    logits = served(**{name: tf.constant(value) for name, value in {**inputs, "mask_positions": positions}.items()})
    np.testing.assert_allclose(logits["logits"].numpy(), keras_logits, atol=1e-4)
