"""Reading a Hugging Face checkpoint directory: weights (safetensors), tokenizer, and a weight tracker.

Weights are read with `safetensors` only. Pickle files (`pytorch_model.bin`) can run arbitrary
code when unpickled, so they are refused unless the caller opts in with `allow_pickle=True`;
even then they are read with `torch.load(weights_only=True)`, which only rebuilds tensors.
"""

import json
import re
import struct
import warnings
from pathlib import Path

import numpy as np

from keras_transformer import tokenizers as kt_tokenizers
from keras_transformer.tokenizers.chat_template import read_chat_template
from keras_transformer.tokenizers.tokenizer import SPECIAL_TOKEN_NAMES

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_FILE = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_SPECIAL_TOKENS_MAP = "special_tokens_map.json"


# --- weights ------------------------------------------------------------------


def _shards(path, single, index):
    """The weight files of a checkpoint in one format: [single] or the shards its index names."""
    if (path / single).is_file():
        return [path / single]
    if (path / index).is_file():
        weight_map = json.loads((path / index).read_text()).get("weight_map", {})
        return [path / name for name in sorted(set(weight_map.values()))]
    return []


def read_weights(path, allow_pickle=False):
    """All tensors of the checkpoint in `path` as {name: numpy array} (bfloat16 widened to float32).

    Args:
        path: the checkpoint directory.
        allow_pickle: bool, read `pytorch_model.bin` when there is no safetensors file. Only
            for checkpoints from a source you trust.
    """
    path = Path(path)
    files = _shards(path, SAFETENSORS_FILE, SAFETENSORS_INDEX)
    if files:
        return _read_safetensors(files)
    pickles = _shards(path, PICKLE_FILE, PICKLE_INDEX)
    if not pickles:
        raise ValueError(
            f"No weights in the Hugging Face checkpoint {path}: expected {SAFETENSORS_FILE} "
            f"(or {SAFETENSORS_INDEX} with its shards)."
        )
    if not allow_pickle:
        raise ValueError(
            f"The checkpoint {path} holds its weights only as a pickle file ({pickles[0].name}). "
            "Unpickling can run arbitrary code hidden in the file, so keras_transformer reads "
            "weights from safetensors only. Convert the checkpoint to model.safetensors (e.g. with "
            "`transformers`: `model.save_pretrained(dir, safe_serialization=True)`) or, if you trust "
            "its source, pass allow_pickle=True (it is then read with torch.load(weights_only=True))."
        )
    return _read_pickles(pickles)


def _read_safetensors(files):
    from safetensors import safe_open

    arrays = {}
    for file in files:
        if not file.is_file():
            raise ValueError(f"Missing weight shard {file}, named by the checkpoint's index.")
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":  # numpy has no bfloat16
                    arrays[name] = _read_bfloat16(file, name)
                else:
                    arrays[name] = f.get_tensor(name)
    return arrays


def _read_bfloat16(file, name):
    """One BF16 tensor of a safetensors file, widened to float32 (bfloat16 is float32's top 16 bits).

    The format: an 8-byte little-endian header length, a JSON header giving each tensor's
    dtype, shape and byte range, then the data.
    """
    with open(file, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_size))[name]
        begin, end = entry["data_offsets"]
        f.seek(8 + header_size + begin)
        raw = np.frombuffer(f.read(end - begin), dtype="<u2")
    return (raw.astype("<u4") << 16).view("<f4").reshape(entry["shape"])


def _read_pickles(files):
    try:
        import torch
    except ImportError:
        raise ValueError("Reading pytorch_model.bin needs `torch`, which is not installed.") from None
    arrays = {}
    for file in files:
        state = torch.load(str(file), map_location="cpu", weights_only=True)
        for name, tensor in state.items():
            tensor = tensor.detach()
            if tensor.dtype == torch.bfloat16:
                tensor = tensor.float()
            arrays[name] = tensor.numpy()
    return arrays


class CheckpointWeights:
    """A checkpoint's tensors, read lazily, with a record of which ones were used.

    A family converter calls `get(name)` for each tensor it maps and `assign(variable, value)`
    to write it; `report(model, ...)` then warns about our variables left at their initial
    values and checkpoint tensors nothing used, so no weight is dropped silently.
    """

    def __init__(self, path, allow_pickle=False):
        self.path = Path(path)
        self.allow_pickle = allow_pickle
        self._arrays = None
        self.used = set()
        self.assigned = set()

    @property
    def arrays(self):
        if self._arrays is None:
            self._arrays = read_weights(self.path, self.allow_pickle)
        return self._arrays

    def has(self, name):
        return name in self.arrays

    def get(self, name):
        """The tensor `name` as float32; a missing tensor is a ValueError naming it."""
        if name not in self.arrays:
            raise ValueError(f"The checkpoint {self.path} has no tensor {name!r}, which the model needs.")
        self.used.add(name)
        return np.asarray(self.arrays[name], dtype="float32")

    def put(self, variable, name, transform=None):
        """variable <- the tensor `name`, through `transform` (the transpose, reshape or slice the family's layout
        needs) when given. A converter's one-tensor assignments go through here: an export (`WeightRecorder`) then
        writes an untransformed tensor straight from the variable."""
        value = self.get(name)
        self.assign(variable, transform(value) if transform else value, name)

    def assign(self, variable, value, source):
        """variable <- value after checking shapes; `source` names the tensor(s) in errors."""
        if tuple(variable.shape) != tuple(value.shape):
            raise ValueError(
                f"Shape mismatch converting {source}: the checkpoint gives {tuple(value.shape)}, "
                f"our variable {variable.path} has {tuple(variable.shape)}."
            )
        variable.assign(value)
        self.assigned.add(id(variable))

    def skip(self, layer, reason):
        """Leave `layer`'s variables at their initial values without a warning: `reason` says why
        the model's outputs do not depend on them."""
        del reason  # documentation at the call site
        self.assigned.update(id(v) for v in layer.weights)

    def check_same(self, name, reference_name):
        """A tied duplicate (e.g. lm_head.weight next to the embedding) must equal its reference."""
        if not self.has(name):
            return
        if not np.array_equal(self.get(name), self.get(reference_name)):
            raise ValueError(
                f"The checkpoint's {name!r} differs from {reference_name!r}, but this model ties them: "
                "untied output embeddings are not supported for this family."
            )

    def report(self, model, known_unused=()):
        """Warn about our variables left unassigned and checkpoint tensors left unused.

        known_unused: regexes of tensors this converter knows but `model` has no place for
        (e.g. a language-model head when the model is a backbone); they are not reported.
        """
        left = [v.path for v in model.weights if id(v) not in self.assigned]
        if left:
            warnings.warn(
                f"{type(model).__name__}: {len(left)} variable(s) are not in the checkpoint {self.path} "
                f"and keep their initial values: {left[:8]}",
                stacklevel=4,
            )
        unused = [
            name
            for name in sorted(self.arrays)
            if name not in self.used and not any(re.search(p, name) for p in known_unused)
        ]
        if unused:
            warnings.warn(
                f"{len(unused)} tensor(s) of the checkpoint {self.path} have no place in a "
                f"{type(model).__name__} and were not converted: {unused[:8]}",
                stacklevel=4,
            )


# --- tokenizer ----------------------------------------------------------------

_TOKENIZER_CLASSES = {
    "BPE": kt_tokenizers.BytePairTokenizer,
    "WordPiece": kt_tokenizers.WordPieceTokenizer,
    "Unigram": kt_tokenizers.UnigramTokenizer,
}
# The special-token ids a model config may give, by role.
_CONFIG_IDS = {"pad_token": "pad_token_id", "bos_token": "bos_token_id", "eos_token": "eos_token_id"}


def _token_string(value):
    """A tokenizer_config.json special-token entry: a string, or an AddedToken dict {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _declared_special_tokens(path):
    """Special tokens named by the checkpoint's tokenizer_config.json / special_tokens_map.json."""
    declared = {}
    for filename in (HF_SPECIAL_TOKENS_MAP, HF_TOKENIZER_CONFIG):  # the later file wins
        file = path / filename
        if file.is_file():
            try:
                data = json.loads(file.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise ValueError(f"Corrupt tokenizer file {file}: {error}") from None
            for role in SPECIAL_TOKEN_NAMES:
                token = _token_string(data.get(role))
                if token is not None:
                    declared[role] = token
    return declared


def load_tokenizer(path, hf_config, defaults, pad_with_eos=False):
    """The checkpoint's tokenizer.json as a keras_transformer Tokenizer, or None when there is none.

    The subclass follows the subword model (BPE, WordPiece, Unigram). Special tokens come from
    tokenizer_config.json, else from the model config's ids, else from the family `defaults`
    (kept only where the vocabulary has them); the model config's pad/bos/eos ids must agree
    with the result. `pad_with_eos`: a tokenizer without a padding token pads with its end
    token (GPT-2 has none; padded positions are masked anyway). The chat template, if any,
    comes from chat_template.jinja or tokenizer_config.json (see `read_chat_template`).
    """
    path = Path(path)
    file = path / TOKENIZER_FILE
    if not file.is_file():
        return None
    import tokenizers

    try:
        backend = tokenizers.Tokenizer.from_file(str(file))
    except Exception as error:  # the Rust side raises a bare Exception
        raise ValueError(f"Could not read {file}: {error}") from None
    # Our preprocessors pad and truncate themselves; a saved padding/truncation setting would
    # change what `tokenize` returns.
    backend.no_padding()
    backend.no_truncation()
    model_name = type(backend.model).__name__
    cls = _TOKENIZER_CLASSES.get(model_name, kt_tokenizers.Tokenizer)
    vocab = backend.get_vocab(with_added_tokens=True)
    id_to_token = {i: t for t, i in vocab.items()}

    special = {role: None for role in SPECIAL_TOKEN_NAMES}
    for role, token in defaults.items():
        if token in vocab:
            special[role] = token
    for role, key in _CONFIG_IDS.items():
        token_id = hf_config.get(key)
        if isinstance(token_id, int) and token_id in id_to_token:
            special[role] = id_to_token[token_id]
    for role, token in _declared_special_tokens(path).items():
        if token not in vocab:
            raise ValueError(f"{path / HF_TOKENIZER_CONFIG} names {role}={token!r}, which is not in {file}.")
        special[role] = token
    if pad_with_eos and special["pad_token"] is None:
        special["pad_token"] = special["eos_token"]

    for role, key in _CONFIG_IDS.items():
        token_id = hf_config.get(key)
        if token_id is None or isinstance(token_id, list):
            continue
        if special[role] is None or vocab[special[role]] != token_id:
            raise ValueError(
                f"The model config's {key}={token_id} is not the tokenizer's {role} "
                f"({special[role]!r} = id {vocab.get(special[role])}): the checkpoint's config.json and "
                f"{TOKENIZER_FILE} disagree."
            )
    config_file = path / HF_TOKENIZER_CONFIG
    tokenizer_config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    tokenizer = cls(backend, chat_template=read_chat_template(path, tokenizer_config), **special)
    tokenizer.source = str(path)
    return tokenizer
