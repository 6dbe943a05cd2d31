"""The in-place decode graph of families built from newer layer types (decode_graph.py, onnx_kernels.py).

Llama-style LMs (RMS norm, rotary positions, grouped-query attention, a sliding window, tied or
untied heads): the graph the ONNX kernels build, held to the Keras model step by step, its cache
written in place, and a bundle's tokens and logits against `lm.generate` / the full forward pass.
"""

import numpy as np
import onnx
import onnxruntime
import pytest

from keras_transformer.export import graphs
from keras_transformer.export.decode_graph import Unsupported, decode_model, prefill_model
from keras_transformer.models import (
    GemmaBackbone,
    GemmaCausalLM,
    LlamaBackbone,
    LlamaCausalLM,
    LlamaCausalLMPreprocessor,
)
from keras_transformer.samplers import BeamSampler
from keras_transformer.tokenizers import BytePairTokenizer
from tests.export.helpers import CORPUS, causal_next_logits, randomize, reference_greedy, to_numpy

pytestmark = pytest.mark.slow
ATOL = 1e-4
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
VARIANTS = {
    "gqa_tied": {"num_key_value_heads": 2},
    "untied_window_linear": {
        "num_key_value_heads": 1,
        "tie_word_embeddings": False,
        "sliding_window": 3,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
    "partial_rotary_llama3_biases": {
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rotary_dim": 16,
        "rope_scaling": LLAMA3,
        "attention_bias": True,
        "attention_output_bias": True,
        "sliding_window": 5,
    },
    # Qwen3's per-head query/key norms (a head size other than D / H), a window on one layer, a NoPE layer (SmolLM3)
    "qk_norm_layer_types_nope": {
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_key_norm": "head",
        "sliding_window": 3,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_layers": [True, False],
    },
    "qk_norm_full": {"num_key_value_heads": 1, "query_key_norm": "full"},
    # Phi-3's longrope on half of each head, past its original length (6) at every step and in the full pass
    "partial_rotary_longrope": {
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rotary_dim": 16,
        "rope_scaling": {
            "rope_type": "longrope",
            "short_factor": [1.0] * 8,
            "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
            "original_max_position_embeddings": 6,
            "attention_factor": 1.2,
        },
    },
    # Gemma: (1 + w) norms before and after each sub-layer, a local layer with its own rotary base, soft caps
    "gemma_post_norms_soft_caps": {
        "family": "gemma",
        "num_key_value_heads": 2,
        "query_pre_attn_scalar": 24.0,
        "local_rope_max_wavelength": 100.0,
        "sliding_window": 3,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_key_norm": "head",
        "attention_logit_soft_cap": 3.0,
        "final_logit_soft_cap": 8.0,
    },
}
FAMILIES = {"llama": (LlamaBackbone, LlamaCausalLM), "gemma": (GemmaBackbone, GemmaCausalLM)}


def _llama(seed=1, vocabulary_size=97, preprocessor=None, family="llama", **options):
    backbone_cls, task_cls = FAMILIES[family]
    backbone = backbone_cls(
        vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=48,
        max_sequence_length=24,
        **options,
    )
    return randomize(task_cls(backbone, preprocessor), seed=seed, std=0.2)


def _run(session, feeds):
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _ops(model):
    return {node.op_type for node in model.graph.node}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_llama_decode_graph_matches_keras(variant):
    """Steps at positions 7..11 (past the window) from Keras's cache: logits of each position and the keys/values
    it appends (the growing form: a past of exactly S positions)."""
    lm = _llama(**VARIANTS[variant])
    backbone = lm.backbone
    model = decode_model(lm)
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= _ops(model)
    session = onnxruntime.InferenceSession(model.SerializeToString())
    batch, start, steps = 2, 7, 5
    _, layers, _, heads, _, head_dim = backbone.cache_shape(1, 1)
    ids = np.random.default_rng(5).integers(0, 97, (batch, start + steps))
    cache = np.zeros(backbone.cache_shape(batch, start + steps), "float32")
    _, cache = lm.call_with_cache(ids.astype("int32"), cache, 0)
    cache = to_numpy(cache)  # (B, L, 2, Hkv, S, Dh): the Keras keys/values of every position
    expected = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}))
    past = {
        f"past_key_values.{i}.{part}": np.ascontiguousarray(cache[:, i, j, :, :start])
        for i in range(layers)
        for j, part in enumerate(("key", "value"))
    }
    for position in range(start, start + steps):
        out = _run(
            session,
            {
                "input_ids": ids[:, position : position + 1],
                "position_ids": np.full((batch, 1), position, np.int64),
                **past,
            },
        )
        np.testing.assert_allclose(out["logits"][:, 0], expected[:, position], atol=ATOL)
        for i in range(layers):
            for j, part in enumerate(("key", "value")):
                assert out[f"present.{i}.{part}"].shape == (batch, heads, position + 1, head_dim)
                np.testing.assert_allclose(out[f"present.{i}.{part}"], cache[:, i, j, :, : position + 1], atol=ATOL)
        past = {f"past_key_values.{i}.{p}": out[f"present.{i}.{p}"] for i in range(layers) for p in ("key", "value")}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_llama_prefill_graph_matches_keras(variant):
    """The prefill the kernels build, on right-padded rows (12, 6 and 1 real tokens, past the window): the real
    positions' logits and keys/values are Keras's (a padded position's are nobody's: nothing real follows it)."""
    assert_prefill_matches_keras(_llama(**VARIANTS[variant]))


def assert_prefill_matches_keras(lm):
    model = prefill_model(lm)
    assert "GroupQueryAttention" in _ops(model)
    session = onnxruntime.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(7)
    batch, length = 3, 12
    ids = rng.integers(0, lm.backbone.vocabulary_size, (batch, length))
    mask = np.arange(length)[None, :] < np.array([[12], [6], [1]])  # (B, T)
    out = _run(session, {"input_ids": ids, "attention_mask": mask.astype(np.int64)})
    expected = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": mask}))
    np.testing.assert_allclose(out["logits"][mask], expected[mask], atol=ATOL)
    cache = np.zeros(lm.backbone.cache_shape(batch, length), "float32")
    _, cache = lm.call_with_cache(ids.astype("int32"), cache, 0, padding_mask=mask)
    cache = to_numpy(cache)  # (B, L, 2, Hkv, S, Dh); the graph's presents (B, S, Hkv, Dh)
    for i in range(cache.shape[1]):
        for j, part in enumerate(("key", "value")):
            present = out[f"present.{i}.{part}"]
            np.testing.assert_allclose(present[mask], cache[:, i, j].transpose(0, 2, 1, 3)[mask], atol=ATOL)


def test_llama_decode_graph_writes_in_place_at_the_last_position():
    """Buffers of max_sequence_length bound as past and present: the step at the last position the rotary
    tables hold writes that position only and gives Keras's logits."""
    lm = _llama(**VARIANTS["untied_window_linear"])
    backbone = lm.backbone
    session = onnxruntime.InferenceSession(decode_model(lm).SerializeToString())
    batch, width = 2, backbone.max_sequence_length
    length = width - 1
    _, layers, _, heads, _, head_dim = backbone.cache_shape(1, 1)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 97, (batch, width))
    cache = np.zeros(backbone.cache_shape(batch, width), "float32")
    _, cache = lm.call_with_cache(ids.astype("int32"), cache, 0)
    cache = to_numpy(cache)
    binding = session.io_binding()
    buffers = {}
    for i in range(layers):
        for j, part in enumerate(("key", "value")):
            buffer = rng.standard_normal((batch, heads, width, head_dim)).astype(np.float32)
            buffer[:, :, :length] = cache[:, i, j, :, :length]
            buffers[i, j] = buffer
            value = onnxruntime.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(f"past_key_values.{i}.{part}", value)
            binding.bind_ortvalue_output(f"present.{i}.{part}", value)
    binding.bind_cpu_input("input_ids", ids[:, length:])
    binding.bind_cpu_input("position_ids", np.full((batch, 1), length, np.int64))
    binding.bind_output("logits")
    session.run_with_iobinding(binding)
    logits = binding.copy_outputs_to_cpu()[-1]
    expected = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}))
    np.testing.assert_allclose(logits[:, 0], expected[:, length], atol=ATOL)
    for (i, j), buffer in buffers.items():
        np.testing.assert_allclose(buffer, cache[:, i, j], atol=ATOL)


def test_rotary_dims_gqa_cannot_rotate_fall_back_to_the_traced_step():
    """GroupQueryAttention's CPU kernel rotates a multiple of 16 dims per head: 8 rotated dims take the traced step."""
    lm = _llama(num_key_value_heads=2, rotary_dim=8)
    for make in (decode_model, prefill_model):
        with pytest.raises(Unsupported, match="rotary"):
            make(lm)
        assert graphs._kernel_graph(make, lm, "graph") is None
    with pytest.raises(Unsupported, match="needs tracing"):
        graphs.build_graphs(lm, traced=False)


@pytest.fixture(scope="module")
def llama_bundle(tmp_path_factory):
    """An untied, windowed, GQA Llama with a tokenizer, exported with `task.export` (a TensorFlow child process
    under JAX or PyTorch)."""
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    preprocessor = LlamaCausalLMPreprocessor(tokenizer, sequence_length=16)
    options = {**VARIANTS["untied_window_linear"], "num_key_value_heads": 2}
    lm = _llama(seed=3, vocabulary_size=tokenizer.vocabulary_size, preprocessor=preprocessor, **options)
    bundle = tmp_path_factory.mktemp("llama") / "bundle"
    lm.export(bundle, format="onnx")
    return lm, bundle


def test_llama_bundle_decodes_in_place_and_matches_keras(llama_bundle):
    from keras_transformer.bundle_runtime import load_bundle_runtime

    lm, bundle = llama_bundle
    decode = onnx.load(bundle / "decode.onnx")
    assert "position_ids" in [value.name for value in decode.graph.input]  # the kernels' graph, not the traced one
    assert "GroupQueryAttention" in _ops(decode)
    generator = load_bundle_runtime(bundle).Generator(bundle)
    tokenizer = lm.preprocessor.tokenizer
    prompts = [[tokenizer.bos_token_id] + tokenizer.tokenize(text) for text in ("def add(a", "for", "the quick brown")]
    eos = tokenizer.eos_token_id
    new = generator.generate_ids(prompts, max_new_tokens=12)
    assert [p + n for p, n in zip(prompts, new)] == lm.generate(prompts, max_new_tokens=12, sampler="greedy")
    assert new == [reference_greedy(causal_next_logits(lm), p, 12, eos) for p in prompts]
    assert max(len(p) + len(n) for p, n in zip(prompts, new)) > 3 + 1  # positions past the window of 3
    beam = generator.generate_ids(prompts, max_new_tokens=8, sampler="beam", num_beams=3)
    assert [p + n for p, n in zip(prompts, beam)] == lm.generate(
        prompts, max_new_tokens=8, sampler=BeamSampler(num_beams=3)
    )

    # The bundle's logits over a generated row: prefill of the first positions, then in-place steps.
    row = prompts[0] + new[0]
    expected = to_numpy(lm({"token_ids": np.array([row], "int32"), "padding_mask": np.ones((1, len(row)), bool)}))[0]
    logits, state = generator._prefill(np.array([row[:2]], np.int64))
    state = generator._cache_buffers(state, len(row))
    for position in range(2, len(row)):
        np.testing.assert_allclose(logits[0], expected[position - 1], atol=ATOL)
        logits, state = generator._step(np.array([row[position]], np.int64), state)
    np.testing.assert_allclose(logits[0], expected[-1], atol=ATOL)
