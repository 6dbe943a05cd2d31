"""A Hugging Face checkpoint's generation_config.json -> our `GenerationConfig` (the model's defaults for
`generate`), and back.

transformers reads the file whenever `generate`'s caller leaves a setting out; so do we:
- `eos_token_id` (an id or a list: Qwen3 and Llama 3 instruct models end at either of two) -> the stop
  tokens of `stop_token_ids="auto"`. Without the file, a list in config.json's `eos_token_id` serves.
- `do_sample` with `temperature`, `top_k` and `top_p` -> a `RandomSampler` (top-k 50 where the file names
  none, transformers' own default); `num_beams` > 1 without sampling -> a `BeamSampler` with
  `length_penalty` and `early_stopping`.
- `repetition_penalty`.

Entries that only describe the model or the call (special-token ids, lengths, `use_cache`, versions) are not
defaults of ours; any other entry (e.g. `min_p`, `typical_p`) is logged as ignored, by name.
"""

import json
import logging
from pathlib import Path

from keras_transformer import samplers

FILE_NAME = "generation_config.json"
# Entries that set no default of `generate` here (ids, lengths, bookkeeping), or that equal ours when absent.
_NOT_DEFAULTS = {
    "bos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "max_length",
    "max_new_tokens",
    "min_length",
    "use_cache",
    "transformers_version",
    "_from_model_config",
    "output_attentions",
    "output_hidden_states",
    "return_dict_in_generate",
}
_READ = {"eos_token_id", "do_sample", "temperature", "top_k", "top_p", "num_beams", "length_penalty"}
_READ |= {"early_stopping", "repetition_penalty"}
# Entries at transformers' default, which changes nothing: not worth a warning.
_NEUTRAL = {"min_p": 0.0, "typical_p": 1.0, "no_repeat_ngram_size": 0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
TRANSFORMERS_TOP_K = 50  # transformers' top-k when sampling and the file names none

_log = logging.getLogger(__name__)
_warned = set()  # files already warned about (a preset's config is read more than once per load)


def read(path, hf_config):
    """The checkpoint's defaults as a `GenerationConfig` config dict, or None when it has none."""
    file = Path(path) / FILE_NAME if path is not None else None
    settings = json.loads(file.read_text(encoding="utf-8")) if file is not None and file.is_file() else {}
    ignored = sorted(
        key
        for key, value in settings.items()
        if key not in _READ | _NOT_DEFAULTS and value is not None and _NEUTRAL.get(key, object()) != value
    )
    if ignored and str(file) not in _warned:
        _warned.add(str(file))
        _log.warning("%s: keras_transformer's generate has no default for %s; ignored.", file, ignored)
    config = {}
    stop = settings.get(
        "eos_token_id", hf_config.get("eos_token_id") if isinstance(hf_config.get("eos_token_id"), list) else None
    )
    if stop is not None:
        config["stop_token_ids"] = [stop] if isinstance(stop, int) else list(stop)
    sampler = _sampler(settings)
    if sampler is not None:
        config["sampler"] = samplers.serialize(sampler)
    if settings.get("repetition_penalty") not in (None, 1.0):
        config["repetition_penalty"] = float(settings["repetition_penalty"])
    return config or None


def _sampler(settings):
    if settings.get("do_sample"):
        top_p = settings.get("top_p")
        return samplers.RandomSampler(
            temperature=float(settings.get("temperature") or 1.0),
            top_k=settings.get("top_k", TRANSFORMERS_TOP_K) or None,
            top_p=None if top_p in (None, 1.0) else float(top_p),
        )
    if (settings.get("num_beams") or 1) > 1:
        return samplers.BeamSampler(
            num_beams=int(settings["num_beams"]),
            length_penalty=float(settings.get("length_penalty", 1.0)),
            early_stopping=settings.get("early_stopping", False),
        )
    return None


def write(generation_config):
    """Our `GenerationConfig` (or None) -> the entries transformers' GenerationConfig takes."""
    if generation_config is None:
        return {}
    entries = {}
    if generation_config.stop_token_ids is not None:
        ids = list(generation_config.stop_token_ids)
        entries["eos_token_id"] = ids[0] if len(ids) == 1 else ids
    if generation_config.repetition_penalty is not None:
        entries["repetition_penalty"] = generation_config.repetition_penalty
    if generation_config.sampler is not None:
        entries.update(_sampler_entries(samplers.get(generation_config.sampler)))
    return entries


def _sampler_entries(sampler):
    if isinstance(sampler, samplers.RandomSampler):
        return {
            "do_sample": True,
            "temperature": sampler.temperature,
            "top_k": sampler.top_k or 0,  # 0: no top-k (transformers would take top-k 50 when absent)
            "top_p": sampler.top_p if sampler.top_p is not None else 1.0,
        }
    if isinstance(sampler, samplers.BeamSampler):
        return {
            "num_beams": sampler.num_beams,
            "length_penalty": sampler.length_penalty,
            "early_stopping": sampler.early_stopping,
        }
    return {}
