"""The tokenizer files of a Hugging Face export (tokenizer.json, tokenizer_config.json), for
`hf_export.export_hugging_face`.

Our `tokenize` adds no special token and the preprocessor adds them; a serving engine has only the
tokenizer, so the exported tokenizer's post-processor adds them instead: the start token of a
causal LM (when the preprocessor adds one), T5's end token after an input, BERT's [CLS] ... [SEP].

The files are written by `transformers`' `PreTrainedTokenizerFast.save_pretrained`, with two
choices that let older `transformers` releases (which vLLM, SGLang and TGI may pin) read them as
the current one does: the chat template goes into tokenizer_config.json (not the newer
chat_template.jinja alone), and the class is named `PreTrainedTokenizerFast`, which every release
has (transformers 5 writes `TokenizersBackend`, its new name for the same class).
"""

import json
from pathlib import Path

import tokenizers
from tokenizers.processors import TemplateProcessing

from keras_transformer.models.causal_lm import CausalLM

TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def save_tokenizer(task, transformers, directory):
    """Write the tokenizer of `task`'s preprocessor into `directory` (an existing folder)."""
    _hf_tokenizer(task, transformers).save_pretrained(directory, save_jinja_files=False)
    config_file = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["tokenizer_class"] = TOKENIZER_CLASS
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _hf_tokenizer(task, transformers):
    """Our tokenizer as a `PreTrainedTokenizerFast` that adds what our preprocessor adds to one text."""
    tokenizer = task.preprocessor.tokenizer
    backend = tokenizers.Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    template = _post_processor(task, tokenizer)
    if template is not None:
        backend.post_processor = template
    special = {role: token for role, token in tokenizer.special_tokens.items() if token is not None}
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=task.backbone.max_sequence_length, **special
    )
    if tokenizer.chat_template is not None:
        fast.chat_template = tokenizer.chat_template
    return fast


def _post_processor(task, tokenizer):
    name = type(task).__name__

    def template(single, pair, tokens):
        return TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, tokenizer.token_to_id(t)) for t in tokens]
        )

    if isinstance(task, CausalLM):  # GPT, Llama, Gemma: the start token, where the preprocessor adds one
        bos = tokenizer.special_tokens["bos_token"]
        if not task.preprocessor.add_start_token or bos is None:
            return None
        return template(f"{bos} $A", f"{bos} $A {bos} $B:1", [bos])
    if name == "T5Seq2SeqLM":
        eos = tokenizer.special_tokens["eos_token"]
        return template(f"$A {eos}", f"$A {eos} $B:1 {eos}:1", [eos])
    cls, sep = tokenizer.special_tokens["cls_token"], tokenizer.special_tokens["sep_token"]
    return template(f"{cls} $A {sep}", f"{cls} $A {sep} $B:1 {sep}:1", [cls, sep])


__all__ = ["TOKENIZER_CLASS", "save_tokenizer"]
