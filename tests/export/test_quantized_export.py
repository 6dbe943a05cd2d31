"""Quantized ONNX bundles (int8, int4) and the export of a model with LoRA enabled (merged).

Tolerances, stated against the float bundle's logits of a tiny GPT with Keras's default
initialisation: int8 (dynamic, per-tensor activations) within 5% of the logits' largest
magnitude, int4 (blocks of 32) within 15%.

The int8 bundle and Keras's `quantize("int8")` do not quantize the same way (per-tensor weight
scales and per-tensor activation scales in ONNX Runtime's `quantize_dynamic`, per-channel weights
and per-token activations in Keras; see `test_the_int8_bundle_follows_keras_int8`), so they are
compared within a tolerance and by greedy continuations that mostly agree, never for equal numbers.
"""

import keras
import numpy as np
import onnxruntime
import pytest

from keras_transformer import cli
from keras_transformer.export import export_model
from keras_transformer.models import GPTBackbone, GPTCausalLM, GPTCausalLMPreprocessor
from keras_transformer.tokenizers import BytePairTokenizer
from tests.export.helpers import CORPUS, bundle_generator, tiny_bert_classifier, to_numpy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    keras.utils.set_random_seed(0)  # the same weights whatever ran before in this process
    tokenizer = BytePairTokenizer.train(CORPUS, vocabulary_size=300)
    backbone = GPTBackbone(
        tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=48,
    )
    lm = GPTCausalLM(backbone, GPTCausalLMPreprocessor(tokenizer, sequence_length=32))
    lm.backbone.enable_lora(4)
    rng = np.random.default_rng(0)
    for variable in lm.backbone.weights:
        if variable.path.endswith("lora_kernel_b"):
            variable.assign(0.05 * rng.standard_normal(tuple(variable.shape)).astype("float32"))
    directory = tmp_path_factory.mktemp("quantized")
    out = {"lm": lm, "float": export_model(lm, directory / "float")}
    out["int8"] = export_model(lm, directory / "int8", quantize="int8")
    lm.save_to_preset(directory / "preset")  # saved merged (Keras writes LoRA layers' kernels merged)
    assert cli.main(["export", str(directory / "preset"), str(directory / "int4"), "--quantize", "int4"]) == 0
    out["int4"] = directory / "int4"
    out["preset"] = directory / "preset"
    assert lm.backbone.trainable_weights and all("lora" in v.path for v in lm.backbone.trainable_weights)  # LoRA kept
    return out


def _prefill_logits(bundle, ids):
    session = onnxruntime.InferenceSession(str(bundle / "prefill.onnx"))
    return session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64)})[0]


def _ids():
    return np.random.default_rng(3).integers(3, 300, (2, 12)).astype(np.int64)


def test_a_lora_model_exports_merged(bundles):
    ids = _ids()
    expected = to_numpy(bundles["lm"]({"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}))
    np.testing.assert_allclose(_prefill_logits(bundles["float"], ids), expected, atol=1e-4)
    assert not any("lora" in p.name for p in bundles["float"].iterdir())


@pytest.mark.parametrize("mode, tolerance", [("int8", 0.05), ("int4", 0.15)])
def test_quantized_logits_stay_near_float(bundles, mode, tolerance):
    ids = _ids()
    reference = _prefill_logits(bundles["float"], ids)
    quantized = _prefill_logits(bundles[mode], ids)
    assert np.abs(quantized - reference).max() < tolerance * np.abs(reference).max()
    assert np.abs(quantized - reference).max() > 0  # the weights did change


def test_quantized_graphs_use_quantized_operators_and_are_smaller(bundles):
    import onnx

    def ops(bundle, graph):
        return {node.op_type for node in onnx.load(str(bundle / graph)).graph.node}

    for graph in ("prefill.onnx", "decode.onnx"):
        assert "MatMulInteger" in ops(bundles["int8"], graph)
        assert "MatMulNBits" in ops(bundles["int4"], graph)
    # The decode graph and the weights it reads: a causal LM's graphs are built with their weights quantized, in one
    # weights file that both graphs read.
    size = {mode: _graph_bytes(bundles[mode] / "decode.onnx") for mode in ("float", "int8", "int4")}
    assert size["int4"] < size["int8"] < 0.5 * size["float"]
    files = {mode: (bundles[mode] / "weights.data").stat().st_size for mode in ("float", "int8", "int4")}
    assert files["int4"] < files["int8"] < 0.5 * files["float"]


def _graph_bytes(path):
    """A graph's file and the bytes of the weights file it points at."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    external = [dict((e.key, e.value) for e in init.external_data) for init in model.graph.initializer]
    return path.stat().st_size + sum(int(entry["length"]) for entry in external if entry)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_no_float_weight_matrix_is_left(bundles, mode):
    """Every weight matrix of both graphs is stored quantized, the traced prefill's too: tf2onnx reshapes its einsum
    kernels at run time (Reshape(W, shape computed from Shape(W))), which the quantizers skip unless ONNX Runtime's
    pre-quantization pass folds them into constants first."""
    import onnx
    from onnx import numpy_helper

    for graph in ("prefill.onnx", "decode.onnx"):
        model = onnx.load(str(bundles[mode] / graph))
        # The prefill reads its first rows of the position table with Slice (no product): that one stays float.
        sliced = {node.input[0] for node in model.graph.node if node.op_type == "Slice"}
        float_matrices = [
            (init.name, list(init.dims))
            for init in model.graph.initializer
            if init.data_type == onnx.TensorProto.FLOAT
            and len(init.dims) >= 2
            and init.name not in sliced
            and numpy_helper.to_array(init).size >= 64 * 64
        ]  # the smallest kernel is (64, 64)
        assert not float_matrices, f"{graph}: {float_matrices}"


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_runner_generates_with_quantized_weights(bundles, mode):
    generator = bundle_generator
    prompts = [[5, 9, 14], [7, 3, 22, 8]]
    float_tokens = generator(bundles["float"]).generate_ids(prompts, max_new_tokens=6)
    tokens = generator(bundles[mode]).generate_ids(prompts, max_new_tokens=6)
    assert [len(row) for row in tokens] == [len(row) for row in float_tokens]
    if mode == "int8":  # int8 keeps these models' first choice; int4's coarser blocks may flip it
        assert [row[0] for row in tokens] == [row[0] for row in float_tokens]


def _agreement(tokens, reference):
    """The share of positions where two lists of equally long continuations hold the same token."""
    pairs = [(a, b) for row, ref in zip(tokens, reference) for a, b in zip(row, ref, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


# "Mostly follows": at least 80% of the greedy tokens equal, position by position (after a first
# difference the rest of a row usually differs too, so this also asks for long equal prefixes).
FOLLOWS = 0.8
CONTINUATION_PROMPTS = [[5, 9, 14], [7, 3, 22, 8], [40, 41, 42, 43, 44], [120, 6], [250, 17, 99, 3], [61, 62]]


def test_the_int8_bundle_follows_keras_int8(bundles):
    """Keras's int8 and the bundle's int8 cannot be made to compute the same numbers: Keras stores a
    symmetric int8 scale per output channel of each kernel and quantizes each token's activations
    with its own scale (per row), while ONNX Runtime's `quantize_dynamic` (the tool the issue asks
    us to use) stores one scale per weight tensor and quantizes each activation tensor with one
    asymmetric uint8 scale and zero point (DynamicQuantizeLinear). The bundle also quantizes the
    embedding table and the tied head, which Keras keeps float. Matching Keras would take a
    hand-written quantization pass, which we do not build. So each is held to the float model and
    to the other within tolerances stated here, and their greedy continuations must mostly agree.
    """
    lm = GPTCausalLM.from_preset(bundles["preset"])
    lm.quantize("int8")
    ids = _ids()
    keras_logits = to_numpy(lm({"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}))
    onnx_logits = _prefill_logits(bundles["int8"], ids)
    float_logits = _prefill_logits(bundles["float"], ids)
    scale = np.abs(float_logits).max()
    assert np.abs(onnx_logits - keras_logits).max() < 0.05 * scale
    assert np.abs(keras_logits - float_logits).max() > 0  # Keras's weights did change

    # Greedy continuations: 6 prompts x 12 new tokens, compared position by position.
    float_tokens = bundle_generator(bundles["float"]).generate_ids(CONTINUATION_PROMPTS, max_new_tokens=12)
    runner_tokens = bundle_generator(bundles["int8"]).generate_ids(CONTINUATION_PROMPTS, max_new_tokens=12)
    keras_tokens = _keras_greedy(lm, CONTINUATION_PROMPTS, 12)
    assert _agreement(runner_tokens, float_tokens) >= FOLLOWS, (runner_tokens, float_tokens)
    assert _agreement(keras_tokens, float_tokens) >= FOLLOWS, (keras_tokens, float_tokens)
    assert _agreement(runner_tokens, keras_tokens) >= FOLLOWS, (runner_tokens, keras_tokens)
    # The threshold tells right weights from wrong ones: with the entries of its transformer blocks' kernels
    # shuffled (weights written in the wrong order), this model's continuations fall below it.
    shuffled = GPTCausalLM.from_preset(bundles["preset"])
    rng = np.random.default_rng(0)
    for variable in shuffled.backbone.weights:
        if "transformer_layer" in variable.path and variable.path.endswith("kernel"):
            values = to_numpy(variable)
            variable.assign(rng.permutation(values.ravel()).reshape(values.shape))
    assert _agreement(_keras_greedy(shuffled, CONTINUATION_PROMPTS, 12), float_tokens) < FOLLOWS


def _keras_greedy(lm, prompts, new_tokens):
    return [
        np.asarray(lm.generate(np.asarray([p], "int32"), max_new_tokens=new_tokens, stop_token_ids=None))[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]


def test_a_traced_bundle_is_quantized_after_it_is_written(tmp_path):
    """A BERT classifier's graph is traced and converted by tf2onnx: the written graph is then rewritten with int8
    weights by ONNX Runtime's `quantize_dynamic` (`quantize.quantize_bundle`; the graph holds its own weights)."""
    import onnx

    task = tiny_bert_classifier()
    bundle = export_model(task, tmp_path / "int8", quantize="int8")
    model = onnx.load(str(bundle / "encoder.onnx"))
    assert "MatMulInteger" in {node.op_type for node in model.graph.node}
    assert not (bundle / "weights.data").exists()
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(4, task.backbone.vocabulary_size, (2, 10)),
        "segment_ids": np.zeros((2, 10), np.int64),
        "padding_mask": np.ones((2, 10), np.int64),
    }
    session = onnxruntime.InferenceSession(str(bundle / "encoder.onnx"))
    logits = session.run(["logits"], {name: value.astype(np.int64) for name, value in inputs.items()})[0]
    expected = to_numpy(
        task({**{k: v.astype("int32") for k, v in inputs.items()}, "padding_mask": inputs["padding_mask"] > 0})
    )
    # 15%: this model is 16 wide, and one int8 scale per tensor is coarse at that size (8% measured).
    assert 0 < np.abs(logits - expected).max() < 0.15 * np.abs(expected).max()


def test_quantize_arguments_are_checked(tmp_path):
    lm = GPTCausalLM(
        GPTBackbone(20, num_layers=1, num_heads=1, hidden_dim=8, intermediate_dim=8, max_sequence_length=8)
    )
    with pytest.raises(ValueError, match="quantize='int2'"):
        export_model(lm, tmp_path / "a", quantize="int2")
    with pytest.raises(ValueError, match="format='onnx' only"):
        export_model(lm, tmp_path / "b", format="tf_saved_model", quantize="int8")
    lm.quantize("int8")
    with pytest.raises(ValueError, match="quantized .int8. in Keras"):
        export_model(lm, tmp_path / "c")
    assert not any(tmp_path.iterdir())
