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
    return _wordpiece_encoder(
        directory,
        architecture,
        seed,
        lambda vocabulary_size, pad: transformers.BertConfig(
            vocab_size=vocabulary_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            type_vocab_size=2,
            pad_token_id=pad,
            attn_implementation="eager",
        ),
    )


def distilbert(directory, architecture="DistilBertForMaskedLM", seed=0):
    """DistilBertForMaskedLM (or DistilBertModel) with a WordPiece tokenizer (BERT's special tokens)."""
    return _wordpiece_encoder(
        directory,
        architecture,
        seed,
        lambda vocabulary_size, pad: transformers.DistilBertConfig(
            vocab_size=vocabulary_size,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            pad_token_id=pad,
            attn_implementation="eager",
        ),
    )


def _wordpiece_encoder(directory, architecture, seed, make_config):
    """`architecture` built from `make_config(vocabulary_size, pad_token_id)`, randomised, saved with a WordPiece
    tokenizer.json trained on TEXTS."""
    tokenizer = WordPieceTokenizer.train(TEXTS, vocabulary_size=150)
    config = make_config(tokenizer.vocabulary_size, tokenizer.pad_token_id)
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
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
}


def llama_style(directory, model_type, seed=0, max_shard_size=None, **options):
    """LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or SmolLM3ForCausalLM with
    grouped-query attention (4 query heads, 2 key/value heads). Llama, Mistral and SmolLM3 get `<s>` / `</s>`
    start and end tokens; Qwen2 and Qwen3 have no start token: their tokenizer_config.json says
    `bos_token: null` while config.json keeps a bos_token_id (the end token), as Qwen2.5's and Qwen3's do.
    `options`: config arguments, e.g. rope_parameters, sliding_window, tie_word_embeddings."""
    tokenizer = BytePairTokenizer.train(TEXTS, vocabulary_size=300)
    backend = tokenizer.backend_tokenizer
    qwen = model_type in ("qwen2", "qwen3")
    if qwen:
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
    if qwen:
        path = Path(directory) / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "bos_token": None}))  # as Qwen2.5's
    return model


GEMMA = {
    "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
}


def gemma(directory, model_type="gemma3_text", seed=0, **options):
    """Gemma3ForCausalLM or Gemma2ForCausalLM with grouped-query attention (4 query heads, 2 key/value heads,
    head size 16), a local layer then a global one with a window of 4, `query_pre_attn_scalar` 24 (not the head
    size), and `<bos>` / `<eos>` / `<pad>` tokens. `options`: config arguments, e.g. rope_parameters."""
    tokenizer = BytePairTokenizer.train(TEXTS, vocabulary_size=300)
    backend = tokenizer.backend_tokenizer
    backend.add_special_tokens(["<pad>", "<eos>", "<bos>"])
    ids = {f"{role}_token_id": backend.token_to_id(f"<{role}>") for role in ("pad", "eos", "bos")}
    config_cls, model_cls = GEMMA[model_type]
    settings = {
        "vocab_size": backend.get_vocab_size(with_added_tokens=True),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "max_position_embeddings": 64,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "attn_implementation": "eager",
        **ids,
        **options,
    }
    model = randomize(model_cls(config_cls(**settings)), seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:  # Gemma's norms scale by (1 + w): w around 0, not 1 (which doubles every norm)
                parameter.sub_(1.0)
            elif "embed_tokens" in name:  # times sqrt(D) it would outweigh the blocks: tied, each token repeats
                parameter.mul_(0.3)
    model.save_pretrained(directory, safe_serialization=True)
    save_hf_tokenizer(tokenizer, directory, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    return model


def to_torch(array):
    return torch.tensor(np.asarray(array), dtype=torch.long)


def sentence_transformers_folder(directory, pooling="mean", normalize=True, max_seq_length=32, seed=0):
    """A random BertModel saved as sentence-transformers saves an embedder: the checkpoint, modules.json,
    1_Pooling/config.json (one pooling mode on), 2_Normalize when `normalize`, sentence_bert_config.json."""
    model = bert(directory, "BertModel", seed=seed)
    directory = Path(directory)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir()
    (directory / "modules.json").write_text(json.dumps(modules))
    modes = {
        "mean": "pooling_mode_mean_tokens",
        "cls": "pooling_mode_cls_token",
        "last_token": "pooling_mode_lasttoken",
    }
    pooling_config = {"word_embedding_dimension": model.config.hidden_size, "include_prompt": True}
    pooling_config.update(
        {key: key == modes.get(pooling, pooling) for key in [*modes.values(), "pooling_mode_max_tokens"]}
    )
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return model


ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4, as RoBERTa's and XLM-R's vocabularies


def roberta(directory, model_type="roberta", seed=0):
    """RobertaForMaskedLM with a byte-level BPE tokenizer, or XLMRobertaForMaskedLM ("xlm-roberta") with a
    SentencePiece-style Unigram one; `<s> <pad> </s> <unk> <mask>` are ids 0-4 (padding id 1: positions start at 2)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    if model_type == "roberta":
        backend = Backend(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=ROBERTA_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    else:
        backend = Backend(models.Unigram())
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=ROBERTA_SPECIALS, unk_token="<unk>")
    backend.train_from_iterator(TEXTS, trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    config_cls, model_cls = {
        "roberta": (transformers.RobertaConfig, transformers.RobertaForMaskedLM),
        "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM),
    }[model_type]
    config = config_cls(
        vocab_size=backend.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=66,  # 64 positions past the padding id
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        attn_implementation="eager",
    )
    model = randomize(model_cls(config), seed, scale=0.2)
    model.save_pretrained(directory, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    fast.save_pretrained(directory)
    return model


def masked_lm_inputs(ours, texts):
    """A BertMaskedLM's inputs for `texts` ([CLS] text [SEP], right-padded) and three real positions per row
    ((B, P) int32, for rows of at least 10 tokens but the first and last)."""
    tokenizer = ours.preprocessor.tokenizer
    ids = [[tokenizer.cls_token_id] + tokenizer.tokenize(text) + [tokenizer.sep_token_id] for text in texts]
    width = max(len(row) for row in ids)
    token_ids = np.full((len(ids), width), tokenizer.pad_token_id, "int32")
    for i, row in enumerate(ids):
        token_ids[i, : len(row)] = row
    mask = token_ids != tokenizer.pad_token_id
    positions = np.array([[1, 2, 3], [2, 5, 9], [1, 3, 4]], "int32")[: len(texts)]  # (B, P)
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids), "padding_mask": mask}, positions


MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]  # after the BPE vocabulary, as ModernBERT's


def modernbert(directory, seed=0, **options):
    """ModernBertForMaskedLM (3 layers, global every second one: global, local, global) with a local window of 4
    (2 positions each side, shorter than the test texts), two rotary bases, and a byte-level BPE tokenizer whose
    [CLS] ... [SEP] specials follow the vocabulary ([MASK] strips the space before it), as ModernBERT's does.
    `options`: config arguments."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(TEXTS, trainer)
    backend.add_special_tokens([AddedToken(t, lstrip=t == "[MASK]", normalized=False) for t in MODERNBERT_SPECIALS])
    ids = {token: backend.token_to_id(token) for token in MODERNBERT_SPECIALS}
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    settings = dict(
        vocab_size=backend.get_vocab_size() + 3,  # unused rows past the tokenizer, as ModernBERT's 50368
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        global_attn_every_n_layers=2,
        local_attention=4,
        global_rope_theta=160000.0,
        local_rope_theta=10.0,
        pad_token_id=ids["[PAD]"],
        bos_token_id=ids["[CLS]"],
        eos_token_id=ids["[SEP]"],
        cls_token_id=ids["[CLS]"],
        sep_token_id=ids["[SEP]"],
        attn_implementation="eager",
        **options,
    )
    model = randomize(transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**settings)), seed, scale=0.2)
    model.save_pretrained(directory, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(directory)
    return model
