"""The plain-PyTorch layer kernels (kernels/torch_kernels.py) against the Keras layers, for every family.

On PyTorch `generate` passes `TorchKernels` as the `call_layer` of the task's one step
description; these tests run each family's `call_with_cache` both ways (prefill, then one token
per step; grouped-query attention, post-norm, RMS norm, relative position bias, cross-attention
with a padded source, tied and separate heads) and require the same logits and caches. On the
other backends they check the kernels are never chosen.
"""

import keras
import numpy as np
import pytest

from keras_transformer.models import (
    GemmaBackbone,
    GemmaCausalLM,
    GPTBackbone,
    GPTCausalLM,
    LlamaBackbone,
    LlamaCausalLM,
    T5Backbone,
    T5Seq2SeqLM,
    TransformerBackbone,
    TransformerSeq2SeqLM,
)
from keras_transformer.kernels import torch_kernels
from tests.conftest import to_numpy

VOCABULARY = 37


def _gpt(**kwargs):
    config = dict(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=24,
        max_sequence_length=32,
    )
    return GPTCausalLM(GPTBackbone(**{**config, **kwargs}))


def _t5(**kwargs):
    config = dict(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        key_dim=6,
        dropout=0.0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
    )
    return T5Seq2SeqLM(T5Backbone(**{**config, **kwargs}))


def _llama(**kwargs):
    config = dict(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        max_sequence_length=32,
    )
    return LlamaCausalLM(LlamaBackbone(**{**config, **kwargs}))


def _gemma(**kwargs):
    """Four (1 + w) norms per block, per-head query/key norms, a local layer (window 3, its own rotary base) and a
    global one, both logits soft-capped (Gemma 3's layout with Gemma 2's caps)."""
    config = dict(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        max_sequence_length=32,
        query_pre_attn_scalar=6.0,
        local_rope_max_wavelength=100.0,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        query_key_norm="head",
        attention_logit_soft_cap=2.0,
        final_logit_soft_cap=5.0,
    )
    return GemmaCausalLM(GemmaBackbone(**{**config, **kwargs}))


def _transformer():
    return TransformerSeq2SeqLM(
        TransformerBackbone(
            VOCABULARY,
            num_layers=2,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=24,
            max_sequence_length=32,
            dropout=0.0,
        )
    )


MODELS = {
    "gpt": _gpt,
    "gpt_gqa_relu": lambda **kw: _gpt(num_key_value_heads=2, activation="relu", **kw),
    "gpt_exact_gelu": lambda **kw: _gpt(activation="gelu", **kw),
    "gpt_gated_silu": lambda **kw: _gpt(activation="gated-silu", **kw),
    "t5_tied_relu": _t5,
    "t5_untied_gated": lambda **kw: _t5(activation="gated-gelu", tie_embedding_weights=False, **kw),
    "transformer_post_norm": _transformer,
    "llama_gqa_tied": _llama,
    # Qwen2's biases, a separate head, llama3 rope scaling, partial rotary, a window shorter than the steps
    "llama_untied_window_partial": lambda **kw: _llama(
        tie_word_embeddings=False,
        attention_bias=True,
        attention_output_bias=False,
        sliding_window=3,
        rotary_dim=2,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        **kw,
    ),
    # Qwen3's per-head query/key norms and head size, a window on one layer only, SmolLM3's NoPE layer
    "llama_qk_norm_layer_types": lambda **kw: _llama(
        query_key_norm="head",
        head_dim=8,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        rope_layers=[False, True],
        **kw,
    ),
    "llama_qk_norm_full": lambda **kw: _llama(query_key_norm="full", tie_word_embeddings=False, **kw),
    # Phi-3's longrope on half of each head: short factors through position 7, long ones from the step at 8 on
    "llama_longrope_partial": lambda **kw: _llama(
        head_dim=8,
        rotary_dim=4,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.5, 2.0],
            "long_factor": [3.0, 9.0],
            "original_max_position_embeddings": 8,
            "attention_factor": 1.2,
        },
        **kw,
    ),
    "gemma_post_norms_soft_caps": _gemma,
    # a dense layer, then a sparse mixture of experts (Mixtral's renormalised top 2 of 4, Qwen2-MoE's gated shared
    # expert): a step's 3 rows make 6 assignments for 4 experts, the prefill's 15 tokens 30 (the sorted paths)
    "llama_moe": lambda **kw: _llama(
        mixture_of_experts=dict(
            num_experts=4, top_k=2, intermediate_dim=12, shared_intermediate_dim=8, shared_expert_gate=True
        ),
        moe_layers=[False, True],
        **kw,
    ),
}


ON_TORCH = keras.config.backend() == "torch"
torch_only = pytest.mark.skipif(not ON_TORCH, reason="the kernels are PyTorch's; elsewhere Keras runs the layers")
# Per compute dtype: how far the kernels' logits may be from Keras's (16-bit products round differently).
TOLERANCES = {
    "float32": 2e-5,
    "bfloat16": 0.1,
    "mixed_bfloat16": 0.1,
    "int8": 1e-4,
    "int4": 2e-5,
    "int4_per_channel": 1e-4,
    "int4_block_8": 2e-5,
    "int4_block_6": 2e-5,
    "int4_per_channel_inputs": 1e-4,
    "bfloat16_int4": 0.1,
    "int8_lora": 1e-4,
    "int4_lora": 2e-5,
    "int8_partial": 1e-4,
}


def test_chosen_for_float_models_on_pytorch_only():
    keras.utils.set_random_seed(3)
    for task in (_gpt(), _t5(), _gpt(dtype="mixed_float16"), _t5(dtype="bfloat16"), _llama(dtype="mixed_bfloat16")):
        assert torch_kernels.supports(task) is ON_TORCH
    quantized = _gpt()
    quantized.quantize("int8")
    assert torch_kernels.supports(quantized) is ON_TORCH  # int8 weights: the kernels compute Keras's int8 call
    for build in (_gpt, _llama):  # int4 weights, in groups of inputs (Keras's default) or per output channel
        for config in (None, keras.quantizers.Int4QuantizationConfig(block_size=-1)):
            quantized = build()
            quantized.quantize("int4", config=config)
            assert torch_kernels.supports(quantized) is ON_TORCH
    quantized.backbone.enable_lora(2)
    assert torch_kernels.supports(quantized) is ON_TORCH  # LoRA over int4 weights (QLoRA): its own product


def _cases():
    cases = [(name, "float32", static) for name in sorted(MODELS) for static in (False, True)]
    # 16-bit models: the kernels compute in the layers' dtype, norms and softmax in float32, as Keras does
    cases += [
        (name, dtype, static)
        for name in (
            "gpt",
            "t5_untied_gated",
            "llama_untied_window_partial",
            "llama_qk_norm_layer_types",
            "gemma_post_norms_soft_caps",
            "llama_moe",
        )
        for dtype in ("bfloat16", "mixed_bfloat16")
        for static in (False, True)
    ]
    # int8 weights (Keras's int8 layers: inputs quantized per row, integer products), fused q/k/v and gate/up
    cases += [
        (name, "int8", static)
        for name in ("gpt", "t5_untied_gated", "llama_untied_window_partial", "transformer_post_norm", "llama_moe")
        for static in (False, True)
    ]
    # int4 weights: Keras's default groups of inputs (a zero point and a scale each: a float kernel), fused
    # q/k/v and gate/up; per output channel (Dense: integer products and a divisor); a bfloat16 model's
    cases += [
        (name, "int4", static)
        for name in ("gpt", "t5_untied_gated", "llama_untied_window_partial", "transformer_post_norm")
        for static in (False, True)
    ]
    cases += [
        (name, "int4_per_channel", static)
        for name in ("gpt_gated_silu", "llama_untied_window_partial")
        for static in (False, True)
    ]
    cases += [("gpt_gated_silu", "int4_per_channel_inputs", False)]  # inputs quantized per row as well
    # several groups along the inputs (width 16 and 24): blocks that fill the rows, and ones that do not
    cases += [("gpt_gated_silu", "int4_block_8", False), ("gpt_gated_silu", "int4_block_6", False)]
    cases += [("llama_untied_window_partial", "bfloat16_int4", static) for static in (False, True)]
    # LoRA over quantized weights (QLoRA), on some of the fused q/k/v and gate/up projections only
    cases += [
        (name, dtype, static)
        for name in ("t5_untied_gated", "llama_untied_window_partial")
        for dtype in ("int8_lora", "int4_lora")
        for static in (False, True)
    ]
    # a model quantized in part (the query and the gate only): q/k/v and gate/up cannot share one product
    cases += [("llama_untied_window_partial", "int8_partial", static) for static in (False, True)]
    return cases


@torch_only
@pytest.mark.parametrize("name, dtype, static", _cases())
def test_logits_and_caches_match_keras(name, dtype, static):
    """Eager kernels (the index an int) and static ones (a compiled step's: the index a tensor, the whole
    cache read under a mask) against the Keras layers, prefill then one token per step."""
    keras.utils.set_random_seed(3)
    if dtype == "float32" or dtype.startswith("int"):
        task = MODELS[name]()
    else:
        task = _with_dtype(name, dtype.removesuffix("_int4"))
    if dtype == "int8_partial":
        for layer in task._flatten_layers():
            if layer.name in ("query", "gate"):
                layer.quantize("int8")
        modes = {layer.name: layer.dtype_policy.quantization_mode for layer in task._flatten_layers()}
        assert modes["query"] == modes["gate"] == "int8" and modes["key"] is None and modes["intermediate"] is None
    elif dtype.startswith("int") or dtype.endswith("_int4"):
        mode = "int8" if dtype.startswith("int8") else "int4"
        config = None
        if dtype.startswith("int4_per_channel"):
            inputs = keras.quantizers.AbsMaxQuantizer(axis=-1) if dtype.endswith("_inputs") else None
            config = keras.quantizers.Int4QuantizationConfig(block_size=-1, activation_quantizer=inputs)
        if dtype.startswith("int4_block_"):
            config = keras.quantizers.Int4QuantizationConfig(block_size=int(dtype.rsplit("_", 1)[1]))
        task.quantize(mode, config=config)
        assert mode in {layer.dtype_policy.quantization_mode for layer in task._flatten_layers()}
    if dtype.endswith("_lora"):
        task.backbone.enable_lora(2, target_names=("query", "value", "gate", "attention_output"))
        factors = [layer.lora_kernel_b for layer in task._flatten_layers() if getattr(layer, "lora_enabled", False)]
        assert factors
        lora_rng = np.random.default_rng(1)
        for b in factors:  # B starts at zero (no update): random, so that a wrong LoRA product shows
            b.assign(lora_rng.normal(0, 0.5, b.shape).astype("float32"))
    import torch

    rng = np.random.default_rng(0)
    batch, length, prefill = 3, 12, 5
    ids = rng.integers(0, VOCABULARY, (batch, length)).astype("int32")
    seq2seq = hasattr(task, "compute_cross_cache")
    step_args = ()
    if seq2seq:
        source = rng.integers(1, VOCABULARY, (batch, 7)).astype("int32")
        source_mask = np.arange(7)[None, :] < np.array([[7], [4], [2]])  # padded sources
        cross = task.compute_cross_cache(task.encode(source, source_mask))  # (B, L, 2, Hkv, S_enc, Dh)
        cross_pairs = [(cross[:, i, 0], cross[:, i, 1]) for i in range(cross.shape[1])]
        step_args = (cross, source_mask)
    shape = task.backbone.cache_shape(batch, length)
    cache_dtype = "bfloat16" if "bfloat16" in dtype else "float32"
    keras_cache = keras.ops.zeros(shape, cache_dtype)
    _, layers, _, kv, _, head_dim = shape
    torch_dtype = getattr(torch, cache_dtype)
    cache = [
        (
            torch.zeros((batch, kv, length, head_dim), dtype=torch_dtype),
            torch.zeros((batch, kv, length, head_dim), dtype=torch_dtype),
        )
        for _ in range(layers)
    ]
    kernels = torch_kernels.TorchKernels(length=length if static else None)
    atol = TOLERANCES[dtype]
    start = 0
    with torch.no_grad():
        for width in [prefill] + [1] * (length - prefill):
            chunk = ids[:, start : start + width]
            expected, keras_cache = task.call_with_cache(chunk, keras_cache, start, *step_args)
            args = (cross_pairs, torch.as_tensor(source_mask)) if seq2seq else ()
            logits, cache = task.call_with_cache(
                torch.as_tensor(chunk), cache, torch.tensor(start, dtype=torch.int32), *args, call_layer=kernels
            )
            np.testing.assert_allclose(
                to_numpy(logits),
                to_numpy(expected),
                atol=atol,
                rtol=0,
                err_msg=f"{name}: positions {start}..{start + width - 1}",
            )
            start += width
    # L x 2 x (B, Hkv, S, Dh) -> (B, L, 2, Hkv, S, Dh)
    stacked = np.stack([np.stack([to_numpy(k.float()), to_numpy(v.float())], axis=1) for k, v in cache], axis=1)
    expected_cache = to_numpy(keras.ops.cast(keras_cache, "float32"))
    np.testing.assert_allclose(stacked, expected_cache, atol=atol, rtol=0)
    if kernels.through_keras:
        raise AssertionError(f"{name}: layers ran through Keras: {kernels.through_keras}")


def _with_dtype(name, dtype):
    """The MODELS entry `name` built in `dtype`, with the float32 model's weights (seed 3)."""
    reference = MODELS[name]()
    task = MODELS[name](dtype=dtype)
    task.backbone.set_weights(reference.backbone.get_weights())
    return task


@torch_only
def test_moe_generation_through_keras_eager_and_compiled_kernels(monkeypatch):
    """The mixture-of-experts family's beam search through Keras's layers, the eager kernels and the compiled
    step (one graph: Dynamo's "eager" backend, as tests/decoding/test_torch_compiled.py runs it): the same tokens.
    4 beams' 8 rows make 16 assignments for 4 experts, the prefill 16 (per-expert runs eagerly, blocks compiled;
    test_mixture_of_experts_kernels.py compiles the per-assignment gathers)."""
    import torch._dynamo

    from keras_transformer.decoding import compile as compile_lib
    from keras_transformer.samplers import BeamSampler

    keras.utils.set_random_seed(3)
    task = MODELS["llama_moe"]()
    rng = np.random.default_rng(0)
    for variable in task.weights:  # large weights: choices far from ties, which round-off could flip
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32") + (variable.path.endswith("scale")))
    prompts = [list(rng.integers(1, VOCABULARY, 5)), list(rng.integers(1, VOCABULARY, 3))]
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_BACKEND_ENV, "eager")

    def generate(mode):
        monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "1" if mode == "compiled" else "0")
        out = task.generate(prompts, max_new_tokens=9, sampler=BeamSampler(num_beams=4))
        return [np.asarray(x).tolist() for x in out]

    with monkeypatch.context() as patch:
        patch.setattr(torch_kernels, "supports", lambda task: False)
        through_keras = generate("eager")
    eager = generate("eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = generate("compiled")
    assert eager == through_keras and compiled == through_keras
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters["graph_break"])


@torch_only
def test_every_layer_of_a_step_has_a_kernel():
    """A layer (or a call) without a kernel still works, through Keras, but slowly: the families' steps need none."""
    keras.utils.set_random_seed(3)
    import torch

    for name, build in MODELS.items():
        task = build()
        shape = task.backbone.cache_shape(2, 8)  # (B, L, 2, Hkv, S, Dh)
        cache = [(torch.zeros(shape[:1] + shape[3:]), torch.zeros(shape[:1] + shape[3:])) for _ in range(shape[1])]
        args = ()
        if hasattr(task, "compute_cross_cache"):
            mask = np.ones((2, 3), bool)
            cross = task.compute_cross_cache(task.encode(np.ones((2, 3), "int32"), mask))
            args = ([(cross[:, i, 0], cross[:, i, 1]) for i in range(shape[1])], torch.as_tensor(mask))
        kernels = torch_kernels.TorchKernels()
        with torch.no_grad():
            task.call_with_cache(
                torch.ones((2, 1), dtype=torch.int32), cache, torch.tensor(0), *args, call_layer=kernels
            )
        assert kernels.through_keras == set(), name


@torch_only
@pytest.mark.parametrize("columns", [7, 8])
def test_int4_unpacking_equals_keras(columns):
    """The kernels' nibble unpacking against Keras's `pack_int4` / `unpack_int4`: every byte value, odd and
    even column counts."""
    import torch

    from keras_transformer.kernels.torch_weights import unpack_int4

    values = np.random.default_rng(0).integers(-8, 8, (300, columns)).astype("int8")
    packed, _, _ = keras.quantizers.pack_int4(values, axis=-1)  # (300, ceil(columns / 2))
    packed = torch.as_tensor(to_numpy(packed))
    every_byte = torch.arange(-128, 128, dtype=torch.int8).reshape(64, 4)  # (64, 4) -> 8 columns
    for tensor, width, expected in ((packed, columns, values), (every_byte, 8, None)):
        unpacked = unpack_int4(tensor, width)
        assert unpacked.dtype == torch.int8 and unpacked.is_contiguous()
        reference = to_numpy(keras.quantizers.unpack_int4(tensor, width, axis=-1))
        np.testing.assert_array_equal(unpacked.numpy(), reference)
        if expected is not None:
            np.testing.assert_array_equal(unpacked.numpy(), expected)
