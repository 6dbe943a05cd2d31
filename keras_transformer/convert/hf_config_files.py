"""config.json and generation_config.json of a Hugging Face export (hf_export.py), written without `transformers`.

config.json holds what describes the model: the architecture, `model_type`, the config arguments hf_export_families.py
builds from our task (every option our model has), the special-token ids and the dtype. `transformers` reads every
entry it leaves out as its config class's default, which is what its own `save_pretrained` would have spelt out
(e.g. `initializer_range`, `use_cache`): tests/convert/test_hf_export.py checks that `AutoConfig` reads our file as
the config transformers' own save of the same model. Beside transformers 5's spelling, the entries transformers 4
reads (`transformers4_keys`), which vLLM, SGLang and TGI may pin.

generation_config.json holds the special-token ids `generate` starts and stops with and our `GenerationConfig`'s
defaults (hf_generation.py), as `GenerationConfig.from_model_config` would take them from config.json.
"""

import importlib.metadata

from keras_transformer.convert import hf_generation

# The Hugging Face config class of each exportable architecture -> its `model_type` (tests check it against
# `transformers`' own classes).
MODEL_TYPES = {
    "GPT2Config": "gpt2",
    "LlamaConfig": "llama",
    "Qwen2Config": "qwen2",
    "Qwen3Config": "qwen3",
    "SmolLM3Config": "smollm3",
    "MistralConfig": "mistral",
    "Phi3Config": "phi3",
    "Gemma2Config": "gemma2",
    "Gemma3TextConfig": "gemma3_text",
    "BertConfig": "bert",
    "RobertaConfig": "roberta",
    "DistilBertConfig": "distilbert",
    "ModernBertConfig": "modernbert",
    "T5Config": "t5",
    "Qwen3MoeConfig": "qwen3_moe",
    "MixtralConfig": "mixtral",
    "OlmoeConfig": "olmoe",
    "Qwen2MoeConfig": "qwen2_moe",
}
_GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
# What `GenerationConfig.from_model_config` also takes from every config (its base class's defaults).
_FROM_EVERY_CONFIG = {"output_attentions": False, "output_hidden_states": False, "use_cache": True}


def model_config(config_cls, model_cls, settings, dtype):
    """config.json's entries (transformers 5's spelling) for the class `model_cls` configured by `settings`."""
    config = {"architectures": [model_cls], "model_type": MODEL_TYPES[config_cls], **settings, "dtype": dtype}
    if config.get("layer_types", ()) is None:  # no window: transformers derives every layer's type, as it writes it
        del config["layer_types"]
    version = transformers_version()
    if version is not None:
        config["transformers_version"] = version
    return config


def generation_config(config, generation):
    """generation_config.json's entries: `config`'s special-token ids (those set), then `generation`'s defaults (our
    task's `GenerationConfig`, or None)."""
    entries = {key: config[key] for key in _GENERATION_IDS if config.get(key) is not None}
    entries.update(_FROM_EVERY_CONFIG)
    entries.update(hf_generation.write(generation))
    version = transformers_version()
    if version is not None:
        entries["transformers_version"] = version
    return entries


def transformers_version():
    """The installed `transformers`' version (read from its metadata, not imported), or None."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers4_keys(config, tied_embeddings):
    """The entries config.json also needs in the spelling transformers 4 reads, each equal to what transformers 5
    wrote and read back by 5 as the same model:
    - `torch_dtype` beside `dtype` (releases before 4.56 read only `torch_dtype`);
    - the Llama architecture: `rope_theta` and `rope_scaling` beside `rope_parameters` (4 reads only those), and
      Qwen3-MoE's `num_experts` beside `num_local_experts`; Phi-3's, Gemma's and ModernBERT's own forms;
    - T5 v1.1 (its own, unscaled head, `tied_embeddings` False): tie_word_embeddings=false, as its checkpoints say.
      transformers 5 writes true with scale_decoder_outputs=false, which 4 reads as v1.0's tied, scaled head.
    """
    keys = {"torch_dtype": config["dtype"]}
    model_type = config["model_type"]
    if model_type == "phi3":
        keys.update(_phi3_transformers4_keys(config["rope_parameters"]))
    elif model_type.startswith("gemma"):
        keys.update(_gemma_transformers4_keys(config["rope_parameters"]))
    elif model_type == "modernbert":
        keys.update(_modernbert_hub_keys(config))
    elif model_type == "t5":
        if not tied_embeddings:
            keys["tie_word_embeddings"] = False
    elif "rope_parameters" in config:  # the Llama architecture
        scaling = dict(config["rope_parameters"])
        keys["rope_theta"] = scaling.pop("rope_theta")
        keys["rope_scaling"] = None if scaling["rope_type"] == "default" else scaling
        if model_type == "qwen3_moe":  # 5 writes num_local_experts; 4 (and the Hub) num_experts
            keys["num_experts"] = keys["num_local_experts"] = config.get("num_local_experts", config.get("num_experts"))
    return keys


def _phi3_transformers4_keys(rope):
    """Phi-3's rotary settings as transformers 4 reads them: top-level `rope_theta` and `partial_rotary_factor`, and a
    `rope_scaling` of exactly `type`, `short_factor` and `long_factor` (4's Phi3Config refuses other fields; an
    attention factor transformers would not derive is kept beside them). transformers 5 reads `rope_scaling` before
    `rope_parameters`, and the same model from it."""
    keys = {"rope_theta": rope["rope_theta"], "partial_rotary_factor": rope["partial_rotary_factor"]}
    keys["rope_scaling"] = None
    if rope["rope_type"] == "longrope":
        names = ("short_factor", "long_factor", "attention_factor")
        keys["rope_scaling"] = {"type": "longrope", **{name: rope[name] for name in names if name in rope}}
    return keys


def _gemma_transformers4_keys(rope):
    """Gemma's rotary bases as transformers 4 reads them: `rope_theta` and `rope_scaling` (Gemma 3's global layers,
    or Gemma 2's one embedding) and `rope_local_base_freq` (Gemma 3's sliding layers)."""
    full = dict(rope.get("full_attention", rope))
    keys = {"rope_theta": full.pop("rope_theta"), "rope_scaling": None if full["rope_type"] == "default" else full}
    if "sliding_attention" in rope:
        keys["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    return keys


def _modernbert_hub_keys(config):
    """ModernBERT's config in the Hub's spelling, which transformers 4 reads: the two rotary bases, and
    `global_attn_every_n_layers` where the layer types follow that pattern (transformers 5 reads `layer_types`)."""
    keys = {
        "global_rope_theta": config["rope_parameters"]["full_attention"]["rope_theta"],
        "local_rope_theta": config["rope_parameters"]["sliding_attention"]["rope_theta"],
    }
    layer_types = config["layer_types"]
    for every in range(1, len(layer_types) + 1):
        if layer_types == ["sliding_attention" if i % every else "full_attention" for i in range(len(layer_types))]:
            keys["global_attn_every_n_layers"] = every
            break
    return keys


__all__ = ["MODEL_TYPES", "generation_config", "model_config", "transformers4_keys", "transformers_version"]
