"""A checkpoint's generation_config.json, read as transformers reads it (convert/hf_generation.py,
decoding/generation_config.py): several end tokens, the sampling defaults, written back out on export, kept by
presets and by the ONNX bundle.

The peer is a random Qwen3ForCausalLM saved locally whose generation_config.json names two end tokens (the
second one a token its greedy continuation reaches) and Qwen3's sampling defaults.
"""

import json

import numpy as np
import pytest
import torch
import transformers

from keras_transformer import decoding, samplers
from keras_transformer.decoding.generate import with_model_defaults
from keras_transformer.models import CausalLM
from tests.convert import hf_models

NEW_TOKENS = 10
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def _greedy_ids(hf, prompt):
    with torch.no_grad():
        return hf.generate(
            hf_models.to_torch([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )[0].tolist()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, peer, prompt, the second end token, ours)."""
    directory = tmp_path_factory.mktemp("qwen3")
    hf = hf_models.llama_style(directory, "qwen3", head_dim=16)
    prompt = [5, 17, 42, 9]
    with torch.no_grad():  # never stopping: the continuation, from which the second end token is taken
        free = hf.generate(
            hf_models.to_torch([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0].tolist()
    second_end = free[len(prompt) + 4]  # reached at the fifth new token (or earlier, if it came before)
    assert second_end != hf.config.eos_token_id
    file = directory / "generation_config.json"
    settings = json.loads(file.read_text())
    settings.update(eos_token_id=[hf.config.eos_token_id, second_end], repetition_penalty=1.1, **SAMPLING)
    file.write_text(json.dumps(settings))
    hf.generation_config = transformers.GenerationConfig.from_pretrained(directory)
    return directory, hf, prompt, second_end, CausalLM.from_preset(directory)


def test_defaults_are_read(checkpoint):
    _, hf, _, second_end, lm = checkpoint
    config = lm.generation_config
    assert config.stop_token_ids == (hf.config.eos_token_id, second_end)
    assert config.repetition_penalty == 1.1
    sampler = samplers.get(config.sampler)
    assert isinstance(sampler, samplers.RandomSampler)
    assert (sampler.temperature, sampler.top_k, sampler.top_p) == (0.6, 20, 0.95)


def test_generate_uses_them_where_the_caller_says_nothing(checkpoint):
    *_, lm = checkpoint
    options = with_model_defaults(lm, decoding.GenerateOptions())
    assert list(options.stop_token_ids) == list(lm.generation_config.stop_token_ids)
    assert options.repetition_penalty == 1.1 and options.sampler == lm.generation_config.sampler
    given = with_model_defaults(
        lm, decoding.GenerateOptions(sampler="beam", stop_token_ids=None, repetition_penalty=1.0)
    )
    assert (given.sampler, given.stop_token_ids, given.repetition_penalty) == ("beam", None, 1.0)


def test_stops_at_either_end_token_as_transformers(checkpoint):
    """Greedy (no penalty) with the checkpoint's two end tokens: transformers' tokens, cut at the second."""
    _, hf, prompt, second_end, lm = checkpoint
    expected = _greedy_ids(hf, prompt)  # transformers stops at either end token of the generation config
    ours = lm.generate([prompt], max_new_tokens=NEW_TOKENS, sampler="greedy", repetition_penalty=1.0)[0]
    assert ours == expected[: len(ours)] and ours[-1] == second_end
    assert len(ours) < len(prompt) + NEW_TOKENS  # it stopped early


def test_kept_by_presets_and_written_back_for_transformers(checkpoint, tmp_path):
    _, _, _, _, lm = checkpoint
    lm.save_to_preset(tmp_path / "preset")
    assert CausalLM.from_preset(tmp_path / "preset").generation_config == lm.generation_config
    out = lm.export(tmp_path / "hf", format="huggingface")
    theirs = transformers.GenerationConfig.from_pretrained(out)
    assert theirs.eos_token_id == list(lm.generation_config.stop_token_ids)
    assert (theirs.do_sample, theirs.temperature, theirs.top_k, theirs.top_p) == tuple(SAMPLING.values())
    assert theirs.repetition_penalty == 1.1
    assert CausalLM.from_preset(out).generation_config == lm.generation_config


@pytest.mark.slow
def test_bundle_stops_at_the_same_tokens(checkpoint, tmp_path):
    from tests.export.helpers import bundle_generator

    _, _, prompt, second_end, lm = checkpoint
    bundle = lm.export(tmp_path / "bundle", format="onnx")
    ours = lm.generate([prompt], max_new_tokens=NEW_TOKENS, sampler="greedy", repetition_penalty=1.0)[0]
    theirs = bundle_generator(bundle).generate_ids([prompt], max_new_tokens=NEW_TOKENS)[0]
    assert prompt + theirs == ours and theirs[-1] == second_end


@pytest.mark.parametrize(
    "config, match",
    [
        ({"stop_token_ids": "eos"}, r"stop_token_ids='eos'"),
        ({"stop_token_ids": [1, -2]}, r"stop_token_ids=\[1, -2\]"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty=0\.0"),
        ({"sampler": "nucleus"}, r"sampler='nucleus'"),
        ({"max_new_tokens": 5}, r"no entries \['max_new_tokens'\]"),
    ],
)
def test_bad_generation_config(config, match):
    with pytest.raises(ValueError, match=match):
        decoding.GenerationConfig.from_config(config)


def test_beam_defaults_and_no_file(tmp_path):
    """num_beams without sampling is a BeamSampler; a checkpoint without the file and one end token has none."""
    from keras_transformer.convert import hf_generation

    (tmp_path / "generation_config.json").write_text(
        json.dumps({"num_beams": 4, "length_penalty": 0.8, "early_stopping": True, "eos_token_id": 1})
    )
    config = decoding.GenerationConfig.from_config(hf_generation.read(tmp_path, {"eos_token_id": 1}))
    beam = samplers.get(config.sampler)
    assert (type(beam), beam.num_beams, beam.length_penalty, beam.early_stopping) == (
        samplers.BeamSampler,
        4,
        0.8,
        True,
    )
    assert hf_generation.read(tmp_path / "none", {"eos_token_id": 1}) is None
    assert hf_generation.read(tmp_path / "none", {"eos_token_id": [1, 2]}) == {"stop_token_ids": [1, 2]}
    assert np.array_equal(config.stop_token_ids, [1])
