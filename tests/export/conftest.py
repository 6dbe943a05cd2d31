"""Exports shared by the export tests: each family's tiny task is exported once per session.

Exports are slow (a TensorFlow conversion, and under JAX or PyTorch a child process), so
every test module asks `exported(family)` for the same task, bundle and SavedModel. GPT is
exported through `task.export` and the command line; the other families through
`export_models` (both formats, one child process).
"""

import json

import pytest

from keras_transformer import cli
from keras_transformer.export import export_models
from tests.export import helpers

_BUILDERS = {
    "gpt": helpers.tiny_gpt,
    "llama": helpers.tiny_llama,
    "bert": helpers.tiny_bert_classifier,
    "t5": helpers.tiny_t5,
    "transformer": helpers.tiny_transformer,
}


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(family) -> {"task", "bundle", "saved_model"}, built and exported on first use."""
    cache = {}

    def get(family):
        if family not in cache:
            task = _BUILDERS[family]()
            directory = tmp_path_factory.mktemp(family)
            bundle, saved_model = directory / "bundle", directory / "saved_model"
            if family == "gpt":  # `task.export`, and the command line's export of a preset of the same weights
                assert task.export(bundle, format="onnx") == bundle
                task.save_to_preset(directory / "preset")
                assert (
                    cli.main(["export", str(directory / "preset"), str(saved_model), "--format", "tf_saved_model"]) == 0
                )
            else:  # both formats in one call (one TensorFlow child process under JAX or PyTorch)
                export_models(task, {bundle: "onnx", saved_model: "tf_saved_model"})
            cache[family] = {"task": task, "bundle": bundle, "saved_model": saved_model}
        return cache[family]

    return get


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
