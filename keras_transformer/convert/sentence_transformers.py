"""A sentence-transformers folder (modules.json beside a Hugging Face checkpoint) -> a `TextEmbedder`'s settings.

sentence-transformers stores an embedder as the checkpoint plus a list of modules run after it (modules.json):
`Transformer` (the checkpoint at the folder's root), `Pooling` (its config.json in a subfolder, usually
1_Pooling, says which pooling) and an optional `Normalize`. The maximum length is sentence_bert_config.json's
`max_seq_length`. Modules we do not implement (e.g. a `Dense` projection after the pooling) and poolings we
lack (max, weighted mean, mean divided by sqrt(length)) are refused with a ValueError naming them.
"""

import json
from pathlib import Path

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"
_MODULE = "sentence_transformers.models."
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")
# Pooling config entry -> our pooling; the other pooling_mode_* entries are refused when true.
_POOLINGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last_token",
}


def read(path):
    """{"pooling", "normalize", "max_seq_length" (or None)} of a sentence-transformers folder, or None when `path`
    is not one (no modules.json)."""
    path = Path(path)
    file = path / MODULES_FILE
    if not file.is_file():
        return None
    modules = json.loads(file.read_text(encoding="utf-8"))
    kinds = {}
    for module in modules:
        kind = str(module.get("type", "")).removeprefix(_MODULE)
        if kind not in _KNOWN_MODULES:
            raise ValueError(
                f"Unsupported sentence-transformers module {module.get('type')!r} in {file}: keras_transformer's "
                f"TextEmbedder implements {[_MODULE + name for name in _KNOWN_MODULES]}."
            )
        kinds[kind] = module
    if "Transformer" not in kinds or "Pooling" not in kinds:
        raise ValueError(f"{file} lists no Transformer and Pooling modules: {modules!r}")
    settings_file = path / SETTINGS_FILE
    settings = json.loads(settings_file.read_text(encoding="utf-8")) if settings_file.is_file() else {}
    return {
        "pooling": _pooling(path / kinds["Pooling"].get("path", "1_Pooling") / "config.json"),
        "normalize": "Normalize" in kinds,
        "max_seq_length": settings.get("max_seq_length"),
    }


def _pooling(file):
    if not file.is_file():
        raise ValueError(f"The sentence-transformers Pooling module has no {file}.")
    config = json.loads(file.read_text(encoding="utf-8"))
    chosen = sorted(key for key, value in config.items() if key.startswith("pooling_mode_") and value)
    if len(chosen) != 1 or chosen[0] not in _POOLINGS:
        raise ValueError(
            f"Unsupported sentence-transformers pooling {chosen} in {file}: keras_transformer's TextEmbedder "
            f"implements exactly one of {sorted(_POOLINGS)}."
        )
    return _POOLINGS[chosen[0]]
