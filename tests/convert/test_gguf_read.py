"""GGUF files written by llama.cpp's own converter (tests/convert/gguf_models.py) -> our models, against the
transformers models they were converted from, and against transformers' own GGUF reader.

Axes: B batch, T length, V vocabulary.
"""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from keras_transformer import cli, hub
from keras_transformer.models import CausalLM, GemmaCausalLM, GPTCausalLM, LlamaCausalLM
from tests.conftest import to_numpy

ATOL = 1e-4
TOKEN_IDS = np.array([[5, 17, 42, 99, 100, 3, 7, 250], [1, 2, 3, 4, 5, 6, 7, 8]])  # (B, T): T past gemma3's window
TEXTS = ["def add(a, b):\n    return a + b", "  the quick  brown fox 🙂 é", "hello world </s> <|endoftext|> x"]
# Each stored type's largest weight error, relative to the tensor's largest magnitude, with 5% for a block's float16
# scale: f16 and bf16 round to 11 and 8 significant bits; Q8_0 to half a step of amax / 127; Q4_1 / Q5_1 to half a
# step of (max - min) / 15 / 31; Q4_0 / Q5_0 put the block's extreme at -8 / -16 steps of d = extreme / -8 / -16, so
# values of the other sign clip at 7 / 15 steps: up to a whole step d = amax / 8 / 16.
WEIGHT_RTOL = {"f16": 2**-11, "bf16": 2**-8, "q8_0": 1.05 / 254, "q5_0": 1.05 / 16, "q5_1": 1.05 / 31}
WEIGHT_RTOL.update({"q4_0": 1.05 / 8, "q4_1": 1.05 / 15})


def ours_logits(lm, ids=TOKEN_IDS):
    return to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))  # (B, T, V)


def peer_logits(peer, ids=TOKEN_IDS):
    with torch.no_grad():
        return peer(torch.tensor(ids)).logits.numpy()  # (B, T, V)


@pytest.fixture(scope="module")
def loaded(llama_cpp_files):
    """name -> our model loaded from the GGUF file (each file loaded once per module)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = CausalLM.from_preset(llama_cpp_files[name][0])
        return cache[name]

    return get


@pytest.mark.parametrize(
    "name, cls",
    [
        ("llama", LlamaCausalLM),
        ("llama_bias", LlamaCausalLM),
        ("qwen2", LlamaCausalLM),
        ("qwen3", LlamaCausalLM),
        ("gpt2", GPTCausalLM),
        ("phi3", LlamaCausalLM),
        ("gemma3", GemmaCausalLM),
        ("qwen3moe", LlamaCausalLM),
        ("mixtral", LlamaCausalLM),
    ],
)
def test_f32_logits_equal_the_source_model(llama_cpp_files, loaded, name, cls):
    """llama: query/key rows permuted by llama.cpp (undone here), head size 16 (not D / H); llama_bias: biases on
    all four attention projections (the query and key biases permuted too); qwen2: query/key/value biases, tied head;
    qwen3: query/key norms; gpt2: fused, transposed Conv1D; phi3: fused qkv and gate/up, partial rotary
    (rope.dimension_count), a window; qwen3moe / mixtral: stacked experts (E, I, D) and the router, top 2 of 4;
    gemma3: norms stored as 1 + w, a window of 4 on both layers, the local rotary base from rope.freq_base_swa."""
    lm = loaded(name)
    assert type(lm) is cls
    peer = llama_cpp_files[name][1]
    np.testing.assert_allclose(ours_logits(lm), peer_logits(peer), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", sorted(WEIGHT_RTOL))
def test_quantized_files_agree_with_transformers_reader(llama_cpp_files, loaded, kind):
    """F16/BF16/Q8_0 written by llama.cpp's converter, Q4_0/Q4_1/Q5_0/Q5_1 by the gguf package's quantizer: our
    load equals transformers' dequantization of the same file (its own code), and its weights are within the type's
    rounding of the float model's (the token embedding: rows of 32, one block each)."""
    path, peer = llama_cpp_files[f"llama_{kind}"]
    ours = ours_logits(loaded(f"llama_{kind}"))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, attn_implementation="eager", dtype=torch.float32
    ).eval()
    np.testing.assert_allclose(ours, peer_logits(theirs), atol=ATOL, rtol=0)
    source = peer.model.embed_tokens.weight.detach().numpy()  # (V, D)
    error = np.abs(to_numpy(loaded(f"llama_{kind}").backbone.token_embedding.embeddings) - source).max()
    assert 0 < error <= WEIGHT_RTOL[kind] * np.abs(source).max()


def test_split_file_loads_as_one(llama_cpp_files, loaded):
    path, _ = llama_cpp_files["split"]
    assert path.name.startswith("llama-00001-of-0000") and len(list(path.parent.glob("*.gguf"))) > 1
    np.testing.assert_array_equal(ours_logits(loaded("split")), ours_logits(loaded("llama")))


def test_missing_split_part_is_refused(llama_cpp_files, tmp_path):
    path, _ = llama_cpp_files["split"]
    for part in path.parent.glob("*.gguf"):
        if "-00002-of-" not in part.name:
            (tmp_path / part.name).symlink_to(part)
    with pytest.raises(ValueError, match=r"missing: .*-00002-of-0000\d\.gguf"):
        CausalLM.from_preset(tmp_path / path.name)


def test_dtype_bfloat16(llama_cpp_files, loaded):
    lm = LlamaCausalLM.from_preset(llama_cpp_files["llama"][0], dtype="bfloat16")
    kernel = lm.backbone.transformer_layers[0].self_attention.query_dense.kernel
    assert str(kernel.dtype) == "bfloat16"
    reference = loaded("llama").backbone.transformer_layers[0].self_attention.query_dense.kernel
    np.testing.assert_array_equal(
        to_numpy(kernel).astype("float32"), to_numpy(reference).astype("bfloat16").astype("float32")
    )


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "sentencepiece", "phi3", "gemma3"])
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(llama_cpp_files, loaded, name):
    """gpt2 / qwen2: byte-level BPE (tokenizer.ggml.model "gpt2"); sentencepiece: Llama 2 style ("llama": tokens,
    scores, byte fallback, no merges in the file), Phi-3's (the same file, its prefix space from a normalizer) and
    Gemma 3's (merges by the tokens' order, no prefix space), with the start token added to a prompt as transformers
    adds it."""
    path, _ = llama_cpp_files[name]
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = loaded(name).preprocessor.tokenizer
    for text in TEXTS:
        assert tokenizer.tokenize(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    # A prompt as the model sees it: the start token where the file asks for it (the SentencePiece file).
    prompts = loaded(name).preprocessor.generate_preprocess(TEXTS)
    assert prompts == [theirs(text)["input_ids"] for text in TEXTS]
    assert (prompts[0][0] == tokenizer.bos_token_id) == (name in ("sentencepiece", "phi3", "gemma3"))


def test_sentencepiece_logits(llama_cpp_files, loaded):
    np.testing.assert_allclose(
        ours_logits(loaded("sentencepiece")), peer_logits(llama_cpp_files["sentencepiece"][1]), atol=ATOL, rtol=0
    )


def test_cli_convert(llama_cpp_files, loaded, tmp_path):
    path, _ = llama_cpp_files["qwen3"]
    assert cli.main(["convert", str(path), str(tmp_path / "preset")]) == 0
    again = CausalLM.from_preset(tmp_path / "preset")
    np.testing.assert_array_equal(ours_logits(again), ours_logits(loaded("qwen3")))
    assert again.preprocessor.tokenizer.tokenize(TEXTS[0]) == loaded("qwen3").preprocessor.tokenizer.tokenize(TEXTS[0])


def test_hub_file_handle(llama_cpp_files, loaded, monkeypatch):
    """hf://org/name/file.gguf[@revision]: the file before the revision; the download asked for is that file of that
    revision (the hub is replaced by the local file: nothing is downloaded in the tests)."""
    path, _ = llama_cpp_files["gpt2"]
    asked = []

    def download(repo_id, filename, revision, **kwargs):
        asked.append((repo_id, filename, revision))
        return str(path)

    monkeypatch.setattr(hub, "_download_file", download)
    lm = CausalLM.from_preset("hf://org/name/sub/gpt2.gguf@refs/pr/1")
    assert set(asked) == {("org/name", "sub/gpt2.gguf", "refs/pr/1")}
    np.testing.assert_array_equal(ours_logits(lm), ours_logits(loaded("gpt2")))
    assert hub.parse_handle("hf://org/name/model-Q4_0.gguf") == ("org/name", "main", "model-Q4_0.gguf")
    assert hub.parse_handle("hf://org/name@v1.0") == ("org/name", "v1.0", None)
    with pytest.raises(ValueError, match="the revision 'main/model.gguf'.* hf://org/name/model.gguf@main"):
        hub.parse_handle("hf://org/name@main/model.gguf")
    with pytest.raises(ValueError, match="Malformed"):
        hub.parse_handle("hf://name/model.gguf")


KQUANTS = Path(__file__).parent / "data" / "llama_kquants.gguf"  # made by data/make_kquants_gguf.sh


def test_k_quants_agree_with_transformers_reader():
    """Q2_K, Q3_K, Q4_K, Q5_K, Q6_K tensors written by llama.cpp's compiled llama-quantize (test data, 620 KB): our
    load equals transformers' dequantization of the same file (its own code) within 1e-4."""
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(KQUANTS).tensors}
    assert kinds == {"F32", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        KQUANTS.parent, gguf_file=KQUANTS.name, attn_implementation="eager", dtype=torch.float32
    ).eval()
    np.testing.assert_allclose(ours_logits(CausalLM.from_preset(KQUANTS)), peer_logits(theirs), atol=ATOL, rtol=0)
