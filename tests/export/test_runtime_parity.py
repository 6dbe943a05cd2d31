"""Same tokens from every runtime: family x runtime x sampler, on the current backend.

Runtimes: Keras (`generate` on this backend), the SavedModel's `generate` / `generate_beam`
signatures (run by a TensorFlow-only process that never imports Keras) and the ONNX bundle's
Keras-free runner. Each result is compared with a reference written out here over the task's
full forward pass (no cache, no sampler code): greedy, beam search (Hugging Face's rules) and
random sampling with temperature, top-k, top-p and the noise of (seed, step, row) (the
runner's numpy twin of `samplers/noise.py`, itself held to the Keras one in
tests/samplers/test_noise.py). A batch of ragged prompts (sources) per family; the models
have large random weights (see `helpers.randomize`), so float round-off between runtimes
cannot flip a choice. Each family is exported once per session (conftest.py).
"""

import json

import pytest

from keras_transformer.bundle_runtime import load_bundle_runtime
from keras_transformer.samplers import BeamSampler, GreedySampler, RandomSampler
from tests.export.helpers import (
    causal_next_logits,
    reference_beam,
    reference_greedy,
    reference_random,
    seq2seq_next_logits,
)

pytestmark = pytest.mark.slow
FAMILIES = ["gpt", "llama", "gemma", "phi3", "moe", "t5", "transformer"]
DECODERS = ("gpt", "llama", "gemma", "phi3", "moe")  # decoder-only: prompts, not sources
RUNTIMES = ["keras", "saved_model", "bundle"]
NEW = 8
SAMPLERS = {
    "greedy": {},
    "beam": {"num_beams": 4},
    "random": {"temperature": 1.5, "top_k": 40, "top_p": 0.95, "seed": 7},
}
TEXTS = ["def add(a", "for", "the quick brown"]
SOURCES = ["translate english to german: the house", "the lazy dog", "def add(a, b):"]

RUN_SAVED_MODELS = """
import json, sys
import numpy as np
import tensorflow as tf

spec = json.load(open(sys.argv[1]))
results = {}
for family, case in spec.items():
    model = tf.saved_model.load(case["path"])
    names = ("token_ids", "padding_mask") if case["decoder"] else ("encoder_token_ids", "encoder_padding_mask")
    prompts = {names[0]: np.array(case["ids"], np.int32), names[1]: np.array(case["mask"], bool)}
    common = {"max_new_tokens": tf.constant(%(new)d), "min_new_tokens": tf.constant(0),
              "repetition_penalty": tf.constant(1.0)}
    outputs = {
        "greedy": model.signatures["generate"](**prompts, **common, temperature=tf.constant(0.0),
                                              top_k=tf.constant(0), top_p=tf.constant(1.0), seed=tf.constant(0)),
        "random": model.signatures["generate"](**prompts, **common, temperature=tf.constant(%(temperature)r),
                                              top_k=tf.constant(%(top_k)d), top_p=tf.constant(%(top_p)r),
                                              seed=tf.constant(%(seed)d)),
        "beam": model.signatures["generate_beam"](**prompts, **common, length_penalty=tf.constant(1.0)),
    }
    results[family] = {
        name: [row[mask].tolist() for row, mask in zip(out["token_ids"].numpy(), out["padding_mask"].numpy())]
        for name, out in outputs.items()
    }
results["keras_transformer_imported"] = "keras_transformer" in sys.modules
print(json.dumps(results))
""" % {"new": NEW, **SAMPLERS["random"]}


def _prompts(family, task):
    """The id lists each runtime reads: GPT prompts (start token first) or seq2seq sources (end token last)."""
    if family in DECODERS:
        tokenizer = task.preprocessor.tokenizer
        return [[tokenizer.bos_token_id] + tokenizer.tokenize(text) for text in TEXTS]
    ids, mask = task.preprocessor.generate_preprocess(SOURCES)
    return [row[m].tolist() for row, m in zip(ids, mask)]


def _decoder_prefix(family, task, prompt):
    return prompt if family in DECODERS else [task.preprocessor.decoder_start_token_id]


def _keras_sampler(name):
    options = SAMPLERS[name]
    return {"greedy": GreedySampler, "beam": BeamSampler, "random": RandomSampler}[name](**options)


@pytest.fixture(scope="module")
def cases(exported):
    """{family: (task, prompts, bundle, saved_model)}."""
    return {
        family: (
            exported(family)["task"],
            _prompts(family, exported(family)["task"]),
            exported(family)["bundle"],
            exported(family)["saved_model"],
        )
        for family in FAMILIES
    }


@pytest.fixture(scope="module")
def expected(cases):
    """reference(family, sampler) -> each row's new tokens, from the full forward pass (computed once each)."""
    memo = {}

    def reference(family, sampler):
        if (family, sampler) not in memo:
            task, prompts = cases[family][:2]
            eos = task.preprocessor.tokenizer.eos_token_id
            rows = []
            for row, prompt in enumerate(prompts):
                next_logits = causal_next_logits(task) if family in DECODERS else seq2seq_next_logits(task, prompt)
                prefix = _decoder_prefix(family, task, prompt)
                if sampler == "greedy":
                    rows.append(reference_greedy(next_logits, prefix, NEW, eos))
                elif sampler == "beam":
                    rows.append(reference_beam(next_logits, prefix, NEW, eos, **SAMPLERS["beam"]))
                else:
                    rows.append(reference_random(next_logits, prefix, NEW, eos, row=row, **SAMPLERS["random"]))
            memo[family, sampler] = rows
        return memo[family, sampler]

    return reference


def saved_model_job(exported, directory):
    """(script, its arguments): every family's SavedModel run with every sampler by a TensorFlow-only process
    (conftest.py's `saved_model_runs` runs it, in the same child as test_saved_model.py's)."""
    spec = {}
    for family in FAMILIES:
        task, saved_model = exported(family)["task"], exported(family)["saved_model"]
        prompts = _prompts(family, task)
        width = max(len(p) for p in prompts)
        spec[family] = {
            "path": str(saved_model),
            "decoder": family in DECODERS,
            "ids": [p + [0] * (width - len(p)) for p in prompts],
            "mask": [[True] * len(p) + [False] * (width - len(p)) for p in prompts],
        }
    directory.mkdir(parents=True)
    (directory / "spec.json").write_text(json.dumps(spec))
    return RUN_SAVED_MODELS, (directory / "spec.json",)


@pytest.fixture(scope="module")
def saved_model_results(saved_model_runs):
    """Every family's SavedModel run with every sampler by one TensorFlow-only process."""
    return saved_model_runs["runtime_parity"]["printed"]


def _new_tokens(family, task, prompts, rows):
    """Whole rows (prompt or decoder start, then new tokens) -> the new tokens."""
    return [list(map(int, row[len(_decoder_prefix(family, task, prompt)) :])) for prompt, row in zip(prompts, rows)]


def _run(runtime, family, sampler, cases, saved_model_results):
    task, prompts, bundle, _ = cases[family]
    if runtime == "keras":
        return _new_tokens(
            family, task, prompts, task.generate(prompts, max_new_tokens=NEW, sampler=_keras_sampler(sampler))
        )
    if runtime == "saved_model":
        return _new_tokens(family, task, prompts, saved_model_results[family][sampler])
    generator = load_bundle_runtime(bundle).Generator(bundle)
    return generator.generate_ids(prompts, max_new_tokens=NEW, sampler=sampler, **SAMPLERS[sampler])


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_runtime_gives_the_reference_tokens(family, runtime, sampler, cases, expected, saved_model_results):
    assert _run(runtime, family, sampler, cases, saved_model_results) == expected(family, sampler)


def test_the_moe_bundle_is_built_by_the_onnx_kernels(cases):
    """The mixture of experts' graphs are the ONNX kernels' (GroupQueryAttention; the stacked experts read through
    Gathers, per assignment or by blocks), not the traced fallback, whose tokens would pass the test above too."""
    import onnx

    bundle = cases["moe"][2]
    for name in ("prefill", "decode"):
        graph = onnx.load(str(bundle / f"{name}.onnx"), load_external_data=False).graph
        assert "GroupQueryAttention" in {node.op_type for node in graph.node}
        stacked = {tensor.name for tensor in graph.initializer if tensor.name.endswith((".gate_up", ".down"))}
        readers = {node.op_type for node in graph.node if stacked & set(node.input)}
        assert len(stacked) == 2 and readers == {"Gather"}, (name, stacked, readers)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cases_are_not_trivial(family, expected, saved_model_results):
    """Random sampling leaves the greedy path, and the SavedModel ran without keras_transformer."""
    assert expected(family, "random") != expected(family, "greedy")
    assert saved_model_results["keras_transformer_imported"] is False
