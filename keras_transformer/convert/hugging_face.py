"""Hugging Face checkpoint directories (config.json, model.safetensors, tokenizer.json) as presets.

`from_preset(hf_dir)` reaches `convert_config` through `presets.load_config` when a directory's
config.json has a `model_type` and no `backbone` entry (the checkpoint reader that keras_transformer/__init__.py
declares, see entry_points.py); `convert(hf_dir, preset_dir)` writes our
own preset format (the `keras-transformer convert` command).

Supported model types: "gpt2" (GPT2Model, GPT2LMHeadModel), "bert", "roberta", "xlm-roberta", "distilbert"
(BertModel, BertForMaskedLM, BertForPreTraining, RobertaModel, RobertaForMaskedLM, XLMRobertaModel,
XLMRobertaForMaskedLM, DistilBertModel, DistilBertForMaskedLM; a sentence-transformers folder of one of them as a
BertTextEmbedder), "modernbert" (ModernBertForMaskedLM, ModernBertModel; a sentence-transformers folder as a
ModernBertTextEmbedder), "t5" (T5ForConditionalGeneration, T5Model),
and the Llama architecture
"llama", "mistral", "qwen2", "qwen3", "smollm3" (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, SmolLM3ForCausalLM and their bare models; sharded safetensors included; a sentence-transformers
folder of one of them, e.g. Qwen3-Embedding, as a LlamaTextEmbedder), and Gemma "gemma3_text",
"gemma2" (Gemma3ForCausalLM, Gemma2ForCausalLM; a multimodal "gemma3" is refused), and "phi3" (Phi3ForCausalLM,
Phi3Model: Phi-3 and Phi-4-mini, as a LlamaCausalLM), and the mixtures of experts "qwen3_moe", "mixtral", "olmoe",
"qwen2_moe" (Qwen3MoeForCausalLM, MixtralForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM and their bare models, as
a LlamaCausalLM with `mixture_of_experts`). Every config
option that changes the computation is mapped or refused with a ValueError naming it.

Example, with a Hugging Face folder written here by `export(..., format="huggingface")`:
>>> import tempfile
>>> from keras_transformer.convert import convert
>>> from keras_transformer.models import CausalLM, LlamaCausalLM
>>> out = tempfile.mkdtemp()
>>> hf_dir = LlamaCausalLM.from_preset("llama_stdlib").export(f"{out}/llama_hf", format="huggingface")
>>> lm = LlamaCausalLM.from_preset(hf_dir)          # converted on the fly
>>> type(CausalLM.from_preset(hf_dir)).__name__     # the base class picks the family
'LlamaCausalLM'
>>> lm.save_to_preset(f"{out}/llama_preset")        # our format
>>> lm = convert(hf_dir, f"{out}/llama_preset_2")   # the same, as `keras-transformer convert` does
"""

from pathlib import Path

from keras_transformer import presets
from keras_transformer.convert import hf_bert, hf_gemma, hf_generation, hf_gpt2, hf_llama, hf_modernbert, hf_phi3
from keras_transformer.convert import hf_moe, hf_t5
from keras_transformer.convert import sentence_transformers
from keras_transformer.convert.checkpoint import CheckpointWeights
from keras_transformer.models.backbone import Backbone
from keras_transformer.models.language_model import LanguageModel
from keras_transformer.models.task import Task, subclasses_on
from keras_transformer.models.text_embedder import TextEmbedder

# model_type -> its converter module; a module converting several types lists them in MODEL_TYPES.
FAMILIES = {
    model_type: module
    for module in (hf_gpt2, hf_bert, hf_modernbert, hf_t5, hf_llama, hf_phi3, hf_gemma, hf_moe)
    for model_type in getattr(module, "MODEL_TYPES", None) or (module.MODEL_TYPE,)
}


def _family(hf_config):
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(
            f"Unsupported Hugging Face model_type={model_type!r}: keras_transformer converts {sorted(FAMILIES)}."
        )
    return FAMILIES[model_type]


def convert_config(path, hf_config, allow_pickle=False):
    """A Hugging Face checkpoint's config.json -> a preset config dict (see `keras_transformer.presets`).

    Args:
        path: the checkpoint directory.
        hf_config: its config.json, as a dict.
        allow_pickle: bool, accept a checkpoint whose weights are only in `pytorch_model.bin`
            (read with `torch.load(weights_only=True)`); only for sources you trust.

    Returns:
        {"family", "backbone", "task", "preprocessor", "tokenizer" (when the directory has a
        tokenizer.json), "weights": callable(model)}. The weights are read when the callable is
        called, with a backbone or a task of the family: it assigns every weight the checkpoint
        has for that model and warns about any left out on either side.
    """
    family = _family(hf_config)
    config = family.convert_config(hf_config, Path(path))
    _add_embedder(config, family, path)
    task = config.get("task")
    if task is not None and issubclass(presets.get_class(task["class_name"], Task), LanguageModel):
        defaults = hf_generation.read(path, hf_config)  # generation_config.json: stop tokens, sampling
        if defaults is not None:
            task["config"]["generation_config"] = defaults
    tokenizer = family.tokenizer(Path(path), hf_config)
    if tokenizer is not None:
        config["tokenizer"] = tokenizer
    weights = CheckpointWeights(path, allow_pickle=allow_pickle)

    def load_weights(model):
        family.load_weights(model, weights, hf_config)
        weights.report(model, known_unused=family.KNOWN_UNUSED + _head_tensors(family, model))

    config["weights"] = load_weights
    return config


def _add_embedder(config, family, path):
    """A sentence-transformers folder is the family's `TextEmbedder` (the one built on its backbone class), with its
    pooling, normalisation, maximum length and preprocessor (convert/sentence_transformers.py)."""
    settings = sentence_transformers.read(path)
    if settings is None:
        return
    backbone_name = config["backbone"]["class_name"]
    found = subclasses_on(TextEmbedder, presets.get_class(backbone_name, Backbone))
    if not found:
        raise ValueError(
            f"{path} is a sentence-transformers folder of a {family.__name__.rsplit('.', 1)[-1]} checkpoint: "
            f"keras_transformer has no TextEmbedder on a {backbone_name} yet."
        )
    embedder = found[0]
    config["task"] = {
        "class_name": embedder.__name__,
        "config": {"pooling": settings["pooling"], "normalize": settings["normalize"]},
    }
    length = config.get("preprocessor", {}).get("config", {}).get("sequence_length")
    if settings["max_seq_length"] is not None:
        length = min(int(settings["max_seq_length"]), config["backbone"]["config"]["max_sequence_length"])
    if length is not None:
        config["preprocessor"] = {
            "class_name": embedder.preprocessor_cls.__name__,
            "config": {"sequence_length": length},
        }


def _head_tensors(family, model):
    """Checkpoint tensors of task heads that `model` does not have (e.g. the LM head, for a backbone)."""
    return tuple(pattern for task_name, pattern in family.HEAD_TENSORS.items() if type(model).__name__ != task_name)


def convert(hf_dir, preset_dir, allow_pickle=False, overwrite=False):
    """Convert a Hugging Face checkpoint directory into a keras_transformer preset directory.

    The task model of the checkpoint (e.g. GPTCausalLM for GPT2LMHeadModel) is saved with its
    preprocessor and tokenizer (when the checkpoint has a tokenizer.json); a checkpoint without a
    task head (BertModel) is saved as a backbone, with its tokenizer.

    Args:
        hf_dir: the Hugging Face checkpoint directory.
        preset_dir: the directory to write.
        allow_pickle: bool, see `convert_config`.
        overwrite: bool, replace an existing `preset_dir`.

    Returns:
        The converted model (a Task or a Backbone).
    """
    _, config = presets.load_config(hf_dir, allow_pickle=allow_pickle)
    if "weights" not in config:  # only a converted config carries its weights loader
        raise ValueError(f"{hf_dir} is not a Hugging Face checkpoint (its config.json has no model_type).")
    if Path(preset_dir).exists() and not overwrite:
        raise ValueError(f"{preset_dir} already exists. Pass overwrite=True to replace it.")
    task_spec = config.get("task")
    if task_spec:
        preprocessor = "auto" if "tokenizer" in config else None
        model = presets.get_class(task_spec["class_name"], Task).from_preset(
            hf_dir, allow_pickle=allow_pickle, preprocessor=preprocessor
        )
    else:
        model = presets.get_class(config["backbone"]["class_name"], Backbone).from_preset(
            hf_dir, allow_pickle=allow_pickle
        )
    if isinstance(model, Task):
        model.save_to_preset(preset_dir, overwrite=overwrite)
        return model
    # A backbone keeps the preprocessor settings (e.g. a sequence length within its positions).
    extra = {"preprocessor": config["preprocessor"]} if "preprocessor" in config else None
    presets.save_backbone(model, preset_dir, overwrite=overwrite, extra=extra)
    if "tokenizer" in config:
        config["tokenizer"].save(preset_dir)
    return model
