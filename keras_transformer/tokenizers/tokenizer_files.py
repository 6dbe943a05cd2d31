"""The tokenizer save format: `tokenizer.json` + `tokenizer_config.json`, and the class registry that reads it back.

`tokenizer.json` is the `tokenizers` JSON; `tokenizer_config.json` holds our class name, the special
token strings and the chat template under the keys Hugging Face uses, so that
`transformers.PreTrainedTokenizerFast.from_pretrained(directory)` reads the directory too. A saved
config names its class; `register` records each `Tokenizer` class by name (done by
`Tokenizer.__init_subclass__`), and `class_named` finds it again when loading.
"""

import json
import os

import tokenizers

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"

__all__ = [
    "CONFIG_FILE",
    "TOKENIZER_FILE",
    "backend_from_config",
    "class_named",
    "read_backend",
    "read_config",
    "register",
    "write",
]

# class name -> class, filled by `register`, read by `class_named`.
_REGISTRY = {}


def register(cls):
    """Records `cls` under its name, so that a config naming it loads as an instance of it."""
    _REGISTRY[cls.__name__] = cls


def class_named(base, config, source):
    """The class a saved config names, checked to be `base` or a subclass of it."""
    class_name = config.get("class_name") if isinstance(config, dict) else None
    if class_name not in _REGISTRY:
        raise ValueError(
            f"{source} was not written by a keras_transformer tokenizer: its class_name must "
            f"be one of {sorted(_REGISTRY)} (for a Hugging Face checkpoint, load its "
            f"tokenizer.json with `from_file`). Received: class_name={class_name!r}"
        )
    target = _REGISTRY[class_name]
    if not issubclass(target, base):
        raise ValueError(f"{source} holds a {class_name}, not a {base.__name__} (use `Tokenizer` to load any kind).")
    return target


def write(tokenizer, directory):
    """Writes `tokenizer`'s two files to `directory`, creating it if needed (see `Tokenizer.save`)."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tokenizer.backend_tokenizer.save(os.path.join(directory, TOKENIZER_FILE))
    config = {"class_name": type(tokenizer).__name__, **tokenizer.special_tokens}
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as file:
        json.dump(config, file, indent=2, ensure_ascii=False)
        file.write("\n")


def read_config(directory):
    """Returns `(config, path)`: the parsed `tokenizer_config.json` of `directory` and its path."""
    config_path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ValueError(
            f"No {CONFIG_FILE} in the directory (to read a tokenizer.json alone, use "
            f"`from_file`). Received: directory={os.fspath(directory)!r}, missing file "
            f"{config_path!r}"
        )
    try:
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError) as error:
        raise ValueError(f"Could not read {config_path!r}: {error}") from error
    return config, config_path


def read_backend(path):
    """Reads a `tokenizers` JSON file into a `tokenizers.Tokenizer`; `path` must be a str."""
    if not os.path.isfile(path):
        raise ValueError(f"No tokenizer file at this path. Received: path={path!r}")
    try:
        return tokenizers.Tokenizer.from_file(path)
    except Exception as error:  # the Rust side raises a bare Exception
        raise ValueError(f"Could not read a `tokenizers` JSON file from path={path!r}: {error}") from error


def backend_from_config(config):
    """The `tokenizers.Tokenizer` held as JSON under `config["tokenizer_json"]` (see `Tokenizer.to_config`)."""
    try:
        return tokenizers.Tokenizer.from_str(config["tokenizer_json"])
    except Exception as error:  # a missing key, or the Rust side's bare Exception
        raise ValueError(f"The config holds no readable `tokenizers` JSON under 'tokenizer_json': {error!r}") from error
