"""Small random Hugging Face checkpoints, built locally with `transformers` (nothing is downloaded).

Each builder returns the in-memory peer (eval mode, eager attention) after saving it, with a
tokenizer.json, to a directory in the Hugging Face layout.
"""

import json
from pathlib import Path

import numpy as np
import torch
import transformers

from keras_transformer.tokenizers import BytePairTokenizer, UnigramTokenizer, WordPieceTokenizer

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "the quick brown fox jumps over the lazy dog",
    "translate English to German: the house is small",
    "a cat sat on the mat and looked at the dog",
] * 10


def randomize(model, seed=0, scale=0.3):
    """Random values everywhere (zero biases and unit norms could hide a missing term)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            is_norm = any(key in name.lower() for key in ("ln_", "layernorm", "layer_norm", "norm.")) and name.endswith(
                "weight"
            )
            parameter.copy_(1.0 + 0.2 * noise if is_norm else scale * noise)
    return model.eval()


def save_hf_tokenizer(tokenizer, directory, **special_tokens):
    """tokenizer.json + Hugging Face's tokenizer_config.json, as `transformers` writes them."""
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, **special_tokens)
    fast.save_pretrained(directory)


def edit_config(directory, **changes):
    """Rewrite some entries of a checkpoint's config.json (None deletes the entry)."""
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def gpt2(directory, seed=0, **options):
    tokenizer = BytePairTokenizer.train(TEXTS, vocabulary_size=300)
    config = transformers.GPT2Config(
        vocab_size=tokenizer.vocabulary_size,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
        **options,
    )
    model = randomize(transformers.GPT2LMHeadModel(config), seed)
    model.save_pretrained(directory, safe_serialization=True)
    save_hf_tokenizer(tokenizer, directory, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    return model


def bert(directory, architecture, seed=0):
    """BertModel or BertForMaskedLM; the tokenizer.json only (its special tokens are BERT's defaults)."""
    tokenizer = WordPieceTokenizer.train(TEXTS, vocabulary_size=150)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocabulary_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )
    model = randomize(getattr(transformers, architecture)(config), seed, scale=0.2)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.backend_tokenizer.save(str(Path(directory) / "tokenizer.json"))
    return model


def t5(directory, seed=0, untied_head=False, **options):
    """T5ForConditionalGeneration. `untied_head`: a v1.1-style checkpoint with its own lm_head,
    written as transformers 4 did (tie_word_embeddings=False, both tensors in the file)."""
    tokenizer = UnigramTokenizer.train(TEXTS, vocabulary_size=120)
    config = transformers.T5Config(
        vocab_size=tokenizer.vocabulary_size,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        decoder_start_token_id=tokenizer.pad_token_id,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
        tie_word_embeddings=not untied_head,
        **options,
    )
    model = transformers.T5ForConditionalGeneration(config)
    if untied_head:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    randomize(model, seed, scale=0.2)
    model.save_pretrained(directory, safe_serialization=True)
    if untied_head:
        from safetensors.torch import save_file

        state = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
        save_file(state, str(Path(directory) / "model.safetensors"), metadata={"format": "pt"})
        edit_config(directory, tie_word_embeddings=False, scale_decoder_outputs=None)
    save_hf_tokenizer(tokenizer, directory, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    return model


LLAMA_STYLE = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
}


def llama_style(directory, model_type, seed=0, max_shard_size=None, **options):
    """LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM with grouped-query attention (4 query
    heads, 2 key/value heads). Llama and Mistral get `<s>` / `</s>` start and end tokens; Qwen2 has
    no start token: its tokenizer_config.json says `bos_token: null` while config.json keeps a
    bos_token_id (the end token), as Qwen2.5's do.
    `options`: config arguments, e.g. rope_parameters, sliding_window, tie_word_embeddings."""
    tokenizer = BytePairTokenizer.train(TEXTS, vocabulary_size=300)
    backend = tokenizer.backend_tokenizer
    if model_type == "qwen2":
        special, ids = {"eos_token": "<|endoftext|>"}, {"bos_token_id": backend.token_to_id("<|endoftext|>")}
    else:
        backend.add_special_tokens(["<s>", "</s>"])
        special = {"bos_token": "<s>", "eos_token": "</s>"}
        ids = {"bos_token_id": backend.token_to_id("<s>")}
    config_cls, model_cls = LLAMA_STYLE[model_type]
    settings = {
        "vocab_size": backend.get_vocab_size(with_added_tokens=True),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "eos_token_id": backend.token_to_id(special["eos_token"]),
        "pad_token_id": None,
        "tie_word_embeddings": False,
        "attn_implementation": "eager",
        **ids,
        **options,
    }
    model = randomize(model_cls(config_cls(**settings)), seed)
    model.save_pretrained(
        directory, safe_serialization=True, **({"max_shard_size": max_shard_size} if max_shard_size else {})
    )
    save_hf_tokenizer(tokenizer, directory, **special)
    if model_type == "qwen2":
        path = Path(directory) / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "bos_token": None}))  # as Qwen2.5's
    return model


def to_torch(array):
    return torch.tensor(np.asarray(array), dtype=torch.long)
