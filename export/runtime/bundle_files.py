"""Reading a bundle directory: its JSON files, ONNX Runtime sessions, tokenizer and chat template.

The chat template module is the package's own `keras_transformer/tokenizers/chat_template.py`:
an export copies that file into the bundle (`keras_transformer/export/onnx.py`, `SHARED_FILES`), so the bundle
and the Keras tokenizer render and validate chat messages with the same code.
"""

import json
import os

import onnxruntime

try:
    import chat_template  # the bundle's copy, next to this file
except ModuleNotFoundError as error:  # export/runtime/ itself (before an export copied it): the package's file
    if error.name != "chat_template":
        raise
    from keras_transformer.tokenizers import chat_template


def read_json(path):
    """A bundle's JSON file as a dict; a missing one means the directory is not a bundle."""
    if not os.path.isfile(path):
        raise ValueError(f"Not a keras_transformer bundle: missing {path}")
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def open_session(path, providers, num_threads):
    """An ONNX Runtime session over the graph at `path` (CPU unless `providers` says otherwise)."""
    options = onnxruntime.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = int(num_threads)
    # A decode step is a few dozen short kernels: threads that sleep between them spend more
    # time waking up than computing, so they spin (faster on an idle machine). Spinning threads
    # steal the CPU, though, from the Python loop between the per-token runs and from other work
    # on a busy machine: they spin at most 20 microseconds, and only inside a run. (Measured:
    # benchmarks/RESULTS.md, "Bundle runtime: numbers cited by its comments", thread spinning.)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.intra_op.spin_duration_us", "20")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return onnxruntime.InferenceSession(path, options, providers=providers or ["CPUExecutionProvider"])


def read_tokenizer(bundle_dir):
    """The bundle's `tokenizers.Tokenizer`, or None when it has no tokenizer.json."""
    path = os.path.join(bundle_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    import tokenizers  # only bundles with a tokenizer need the package

    return tokenizers.Tokenizer.from_file(path)


def read_chat_template(bundle_dir):
    """-> (the chat template or None, {special-token role: string}) from the bundle's tokenizer files."""
    config_path = os.path.join(bundle_dir, "tokenizer_config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    special = {name: config[name] for name in chat_template.SPECIAL_TOKEN_NAMES if isinstance(config.get(name), str)}
    return chat_template.read_chat_template(bundle_dir, config), special
