"""Exports shared by the export tests: each family's tiny task is exported once per session.

Exports are slow (a TensorFlow conversion, and under JAX or PyTorch a child process), so
every test module asks `exported(family)` for the same task, bundle and SavedModel. GPT is
exported through `task.export` and the command line; the other families through
`export_models` (both formats, one child process).

The tasks' weights are drawn with numpy, so every backend builds the same task, and its exports are the same
files whatever backend made them (tests/export/test_decoder_export.py's
`test_artifacts_identical_to_a_tensorflow_export` holds this on every backend, with an export of its own). So
the exports are kept in a cache shared by `make test`'s three pytest processes (`EXPORT_CACHE`), keyed by the
task's config and weights and by every source file of the package and of the bundle runtime: the first
backend's run exports, the next ones read the same files and test them against their own Keras model.
"""

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

import keras
import pytest

from keras_transformer import cli
from keras_transformer.export import export_models
from tests.export import helpers

_BUILDERS = {
    "gpt": helpers.tiny_gpt,
    "llama": helpers.tiny_llama,
    "gemma": helpers.tiny_gemma,
    "phi3": helpers.tiny_phi3,
    "moe": helpers.tiny_moe,
    "bert": helpers.tiny_bert_classifier,
    "t5": helpers.tiny_t5,
    "transformer": helpers.tiny_transformer,
}


EXPORT_CACHE = helpers.TEST_CACHE
_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(family) -> {"task", "bundle", "saved_model"}, built and exported (or read from `EXPORT_CACHE`)
    on first use."""
    cache = {}

    def get(family):
        if family not in cache:
            task = _BUILDERS[family]()
            directory = tmp_path_factory.mktemp(family)
            bundle, saved_model = directory / "bundle", directory / "saved_model"
            stored = EXPORT_CACHE / _export_key(family, task)
            if stored.is_dir():
                shutil.copytree(stored / "bundle", bundle)
                shutil.copytree(stored / "saved_model", saved_model)
            else:
                _export(family, task, directory, bundle, saved_model)
                _store(stored, bundle, saved_model)
            cache[family] = {"task": task, "bundle": bundle, "saved_model": saved_model}
        return cache[family]

    return get


def _export(family, task, directory, bundle, saved_model):
    if family == "gpt":  # `task.export`, and the command line's export of a preset of the same weights
        assert task.export(bundle, format="onnx") == bundle
        task.save_to_preset(directory / "preset")
        assert cli.main(["export", str(directory / "preset"), str(saved_model), "--format", "tf_saved_model"]) == 0
    else:  # both formats in one call (one TensorFlow child process under JAX or PyTorch)
        export_models(task, {bundle: "onnx", saved_model: "tf_saved_model"})


def _export_key(family, task):
    """sha256 of what the exports depend on: the task's config, tokenizer and weights, the package's, the bundle
    runtime's and these tests' sources, and the converters' versions (any change exports again)."""
    digest = hashlib.sha256(family.encode())
    digest.update(json.dumps(task.get_config(), sort_keys=True, default=str).encode())
    tokenizer = getattr(task.preprocessor, "tokenizer", None)
    if tokenizer is not None:
        digest.update(tokenizer.backend_tokenizer.to_str().encode())
    for package in ("keras", "tensorflow", "tf2onnx", "onnx", "onnxruntime"):
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    for variable in task.weights:
        digest.update(variable.path.encode())
        digest.update(keras.ops.convert_to_numpy(variable).tobytes())
    for folder in ("keras_transformer", "export", "tests/export"):
        for file in sorted((_ROOT / folder).rglob("*.py")):
            digest.update(str(file.relative_to(_ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:32]


def _store(stored, bundle, saved_model):
    """Copy the exports into the cache under a temporary name, then rename: a reader never sees half an entry."""
    EXPORT_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=EXPORT_CACHE))
    shutil.copytree(bundle, staging / "bundle")
    shutil.copytree(saved_model, staging / "saved_model")
    try:
        os.replace(staging, stored)
    except OSError:  # another process stored the same entry first
        shutil.rmtree(staging, ignore_errors=True)


# One TensorFlow-only child process runs the SavedModel checks of test_saved_model.py and
# test_runtime_parity.py: TensorFlow is imported, and each SavedModel loaded, once instead of twice.
# Each check is its own script (its own namespace and sys.argv); the child never imports
# keras_transformer, and each script still reports whether it was imported.
RUN_SAVED_MODEL_JOBS = """
import contextlib, io, json, sys
import tensorflow as tf

_load, _loaded = tf.saved_model.load, {}

def _load_once(path, *args, **kwargs):
    key = (str(path), args, tuple(sorted(kwargs.items())))
    if key not in _loaded:
        _loaded[key] = _load(path, *args, **kwargs)
    return _loaded[key]

tf.saved_model.load = _load_once
jobs = json.load(open(sys.argv[1]))
results = {}
for name, job in jobs.items():
    sys.argv = ["-c", *job["args"]]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(job["code"], "<" + name + ">", "exec"), {"__name__": "__main__"})
    results[name] = json.loads(printed.getvalue().strip().splitlines()[-1])
print(json.dumps(results))
"""


@pytest.fixture(scope="session")
def saved_model_runs(exported, tmp_path_factory):
    """{"saved_model" | "runtime_parity": {"printed": the JSON its script printed last, "directory": its files}},
    from one child process (run on first use)."""
    from tests.export import test_runtime_parity, test_saved_model

    directory = tmp_path_factory.mktemp("saved_model_jobs")
    jobs = {}
    for name, module in (("saved_model", test_saved_model), ("runtime_parity", test_runtime_parity)):
        code, args = module.saved_model_job(exported, directory / name)
        jobs[name] = {"code": code, "args": [str(arg) for arg in args]}
    (directory / "jobs.json").write_text(json.dumps(jobs))
    printed = helpers.run_python(RUN_SAVED_MODEL_JOBS, directory / "jobs.json", timeout=600)
    return {name: {"printed": printed[name], "directory": directory / name} for name in jobs}


@pytest.fixture(scope="session")
def kernel_gpt(tmp_path_factory):
    """(the tiny GPT task, its bundle written by the ONNX kernels: no tracing, any backend; decode graph with a
    symbolic token axis)."""
    from keras_transformer.export.onnx import write_onnx_bundle

    task = helpers.tiny_gpt()
    directory = tmp_path_factory.mktemp("kernel_gpt") / "tiny_gpt"
    directory.mkdir()
    write_onnx_bundle(task, directory, traced=False)
    return task, directory


@pytest.fixture(scope="module")
def server(bundle):
    """The module's `bundle` served by `python BUNDLE/serve.py` (test_serve.py's `Server`), for the module."""
    from tests.export.test_serve import Server  # a test module: imported only by the modules that serve

    server = Server(bundle)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    """The official `openai` client of the module's `server`."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def stdlib_draft_bundles(tmp_path_factory):
    """{"target", "draft"}: (the trained `llama_stdlib` and `llama_stdlib_draft` presets (the same tokenizer), their
    bundles written by the ONNX kernels: no tracing, any backend, a fraction of a second each)."""
    from keras_transformer.export.onnx import write_onnx_bundle
    from keras_transformer.models import CausalLM

    pair = {}
    for role, preset in (("target", "llama_stdlib"), ("draft", "llama_stdlib_draft")):
        task = CausalLM.from_preset(preset)
        directory = tmp_path_factory.mktemp("stdlib_draft") / preset
        directory.mkdir()
        write_onnx_bundle(task, directory, traced=False)
        pair[role] = (task, directory)
    return pair
