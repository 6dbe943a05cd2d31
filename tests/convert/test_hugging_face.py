"""The Hugging Face entry point: refusals (model types, options, pickle), weight formats, `convert` and the CLI.

Uses a random GPT-2 checkpoint (built once for the module) and copies of it with one thing changed;
configs the converter must refuse are written by hand (refusal happens before any weight is read).
"""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from keras_transformer import cli
from keras_transformer.convert import convert
from keras_transformer.models import Backbone, GPTBackbone, GPTCausalLM
from tests.conftest import to_numpy
from tests.convert import hf_models

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf_gpt2")
    return directory, hf_models.gpt2(directory, seed=3)


@pytest.fixture
def copy(tmp_path, checkpoint):
    """A fresh copy of the checkpoint directory, to change one thing in."""
    target = tmp_path / "hf"
    shutil.copytree(checkpoint[0], target)
    return target


def _expected_logits(hf, x):
    with torch.no_grad():
        return hf(
            input_ids=hf_models.to_torch(x["token_ids"]), attention_mask=hf_models.to_torch(x["padding_mask"])
        ).logits.numpy()


def _inputs(vocabulary_size):
    token_ids = np.random.default_rng(0).integers(1, vocabulary_size, (2, 9)).astype("int32")
    padding_mask = np.arange(9)[None, :] < np.array([[9], [5]])
    return {"token_ids": np.where(padding_mask, token_ids, 0).astype("int32"), "padding_mask": padding_mask}


def _write_config(directory, config):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# --- refusals -----------------------------------------------------------------


def test_unsupported_model_type(copy):
    hf_models.edit_config(copy, model_type="falcon")
    converted = (
        r"\['bert', 'distilbert', 'gemma2', 'gemma3', 'gemma3_text', 'gpt2', 'llama', 'mistral', 'mixtral', "
        r"'modernbert', 'olmoe', 'phi3', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe', 'roberta', 'smollm3', 't5', "
        r"'xlm-roberta'\]"
    )
    with pytest.raises(ValueError, match=r"model_type='falcon'.*" + converted):
        GPTCausalLM.from_preset(copy)


UNSUPPORTED = [
    ({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ({"model_type": "gpt2", "reorder_and_upcast_attn": True}, "reorder_and_upcast_attn=True"),
    ({"model_type": "gpt2", "scale_attn_weights": False}, "scale_attn_weights=False"),
    ({"model_type": "gpt2", "add_cross_attention": True}, "add_cross_attention=True"),
    ({"model_type": "gpt2", "tie_word_embeddings": False}, "tie_word_embeddings=False"),
    ({"model_type": "gpt2", "activation_function": "gelu_fast"}, "activation_function='gelu_fast'"),
    ({"model_type": "gpt2", "resid_pdrop": 0.2}, "resid_pdrop=0.2"),
    ({"model_type": "bert", "position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"model_type": "bert", "is_decoder": True}, "is_decoder=True"),
    ({"model_type": "bert", "add_cross_attention": True}, "add_cross_attention=True"),
    ({"model_type": "bert", "hidden_act": "mish"}, "hidden_act='mish'"),
    ({"model_type": "t5", "feed_forward_proj": "gated-mish"}, "feed_forward_proj='gated-mish'"),
    ({"model_type": "t5", "decoder_start_token_id": 5}, "decoder_start_token_id=5"),
    ({"model_type": "t5", "architectures": ["T5EncoderModel"]}, "T5EncoderModel"),
]


@pytest.mark.parametrize("config, message", UNSUPPORTED, ids=[m for _, m in UNSUPPORTED])
def test_unsupported_options_are_refused_by_name(tmp_path, config, message):
    directory = _write_config(tmp_path / "hf", config)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        Backbone.from_preset(directory)


def test_config_and_tokenizer_must_agree_on_special_tokens(copy):
    hf_models.edit_config(copy, eos_token_id=5)
    with pytest.raises(ValueError, match="eos_token_id=5"):
        GPTCausalLM.from_preset(copy)


def test_pickle_only_checkpoint_is_refused_unless_allowed(copy, checkpoint, monkeypatch):
    _, hf = checkpoint
    (copy / "model.safetensors").unlink()
    torch.save(hf.state_dict(), copy / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pickle.*arbitrary code.*allow_pickle=True"):
        GPTCausalLM.from_preset(copy)
    with pytest.raises(ValueError, match="pickle"):
        convert(copy, copy.parent / "out")
    # The explicit opt-in reads it, with torch.load(weights_only=True) only.
    calls = []
    real_load = torch.load

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    lm = GPTCausalLM.from_preset(copy, allow_pickle=True)
    assert calls == [True]
    x = _inputs(hf.config.vocab_size)
    np.testing.assert_allclose(
        to_numpy(lm(x))[x["padding_mask"]], _expected_logits(hf, x)[x["padding_mask"]], atol=ATOL, rtol=0
    )


def test_checkpoint_without_weights(copy):
    (copy / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="No weights"):
        GPTBackbone.from_preset(copy)
    assert GPTBackbone.from_preset(copy, load_weights=False).num_layers == 2  # the architecture alone


def test_missing_tensor_is_named(copy):
    arrays = load_file(copy / "model.safetensors")
    del arrays["transformer.ln_f.weight"]
    save_file(arrays, copy / "model.safetensors")
    with pytest.raises(ValueError, match="transformer.ln_f.weight"):
        GPTBackbone.from_preset(copy)


def test_unknown_tensor_is_reported(copy):
    arrays = load_file(copy / "model.safetensors")
    arrays["transformer.h.0.attn.rotary.inv_freq"] = np.ones(4, "float32")
    save_file(arrays, copy / "model.safetensors")
    with pytest.warns(UserWarning, match="rotary.inv_freq"):
        GPTBackbone.from_preset(copy)


# --- weight formats -----------------------------------------------------------


def test_sharded_safetensors(tmp_path, checkpoint):
    directory, hf = checkpoint
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    shutil.copy(directory / "tokenizer.json", tmp_path)
    lm = GPTCausalLM.from_preset(tmp_path)
    x = _inputs(hf.config.vocab_size)
    np.testing.assert_allclose(
        to_numpy(lm(x))[x["padding_mask"]], _expected_logits(hf, x)[x["padding_mask"]], atol=ATOL, rtol=0
    )


def test_bfloat16_weights_are_widened_exactly(tmp_path, checkpoint):
    _, hf = checkpoint
    arrays = {name: tensor.to(torch.bfloat16) for name, tensor in hf.state_dict().items()}
    from safetensors.torch import save_file as save_torch

    save_torch(arrays, str(tmp_path / "model.safetensors"))
    shutil.copy(checkpoint[0] / "config.json", tmp_path)
    backbone = GPTBackbone.from_preset(tmp_path)
    expected = arrays["transformer.wte.weight"].float().numpy()
    np.testing.assert_array_equal(to_numpy(backbone.token_embedding.embeddings), expected)
    assert not np.array_equal(expected, hf.transformer.wte.weight.detach().numpy())  # it really was rounded


# --- convert and the command line ---------------------------------------------


def test_convert_writes_our_preset_format(tmp_path, checkpoint):
    directory, hf = checkpoint
    lm = convert(directory, tmp_path / "preset")
    config = json.loads((tmp_path / "preset" / "config.json").read_text())
    assert config["backbone"]["class_name"] == "GPTBackbone" and config["task"]["class_name"] == "GPTCausalLM"
    assert {"model.weights.h5", "task.weights.h5", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (tmp_path / "preset").iterdir()
    }
    reloaded = GPTCausalLM.from_preset(tmp_path / "preset")
    x = _inputs(hf.config.vocab_size)
    np.testing.assert_array_equal(to_numpy(reloaded(x)), to_numpy(lm(x)))
    np.testing.assert_allclose(
        to_numpy(reloaded(x))[x["padding_mask"]], _expected_logits(hf, x)[x["padding_mask"]], atol=ATOL, rtol=0
    )
    with pytest.raises(ValueError, match="already exists"):
        convert(directory, tmp_path / "preset")


def test_cli_convert(tmp_path, checkpoint, capsys):
    directory, _ = checkpoint
    assert cli.main(["convert", str(directory), str(tmp_path / "preset")]) == 0
    assert "GPTCausalLM" in capsys.readouterr().out
    assert GPTBackbone.from_preset(tmp_path / "preset").num_layers == 2
    bad = _write_config(tmp_path / "bad", {"model_type": "falcon"})
    assert cli.main(["convert", str(bad), str(tmp_path / "out")]) == 2
    assert "model_type='falcon'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
