"""Checkpoint formats in and out: Hugging Face folders read (`hugging_face.convert`, a mapping per family in
`hf_bert.py`, `hf_gpt2.py`, `hf_llama.py` (Llama, Qwen2, Qwen3, Mistral, SmolLM3) and `hf_t5.py`) and written
(`hf_export.py`, `hf_tokenizer.py`). No model code lives here: only the mapping of each family's names and options."""

from keras_transformer.convert.hugging_face import convert

__all__ = ["convert"]
