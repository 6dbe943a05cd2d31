"""The export cases' fixtures (hf_export_cases.py holds the cases): each test module builds the cases it uses once."""

import pytest
import transformers

from tests.convert import gguf_models, hf_models
from tests.convert.hf_export_cases import CASES, CHAT_TEMPLATE, Case


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(name) -> Case: the original checkpoint, ours converted from it, its export and transformers' load of it."""
    built = {}

    def get(name):
        if name not in built:
            make, task_cls, auto = CASES[name]
            source = tmp_path_factory.mktemp(name)
            peer = make(source)
            ours = task_cls.from_preset(source)
            if name == "llama":
                ours.preprocessor.tokenizer.chat_template = CHAT_TEMPLATE
            out = ours.export(tmp_path_factory.mktemp(name + "_hf") / "out", format="huggingface")
            theirs = getattr(transformers, auto).from_pretrained(out, attn_implementation="eager").eval()
            built[name] = Case(source, peer, ours, out, theirs)
        return built[name]

    return get


@pytest.fixture(scope="module", params=list(CASES))
def case(request, build):
    return request.param, build(request.param)


@pytest.fixture(scope="session")
def llama_cpp_files(tmp_path_factory):
    """{name: (GGUF file written by llama.cpp's convert_hf_to_gguf.py, the transformers model it came from)}; see
    tests/convert/gguf_models.py. Built once per test session: random models, one converter process."""
    root = tmp_path_factory.mktemp("llama_cpp")
    peers = {
        "llama": hf_models.llama_style(root / "llama", "llama", head_dim=16),
        # transformers' GGUF reader drops llama's attention biases: this one is compared with its source only
        "llama_bias": hf_models.llama_style(root / "llama_bias", "llama", attention_bias=True, seed=1),
        "qwen2": hf_models.llama_style(root / "qwen2", "qwen2", tie_word_embeddings=True),
        "qwen3": hf_models.llama_style(root / "qwen3", "qwen3", head_dim=16),
        "gpt2": hf_models.gpt2(root / "gpt2"),
        "sentencepiece": gguf_models.sentencepiece_llama(root / "sentencepiece"),
        "phi3": gguf_models.phi3(root / "phi3"),
        "gemma3": gguf_models.gemma3(root / "gemma3"),
        "qwen3moe": gguf_models.mixture_of_experts(root / "qwen3moe", "qwen3_moe"),
        "mixtral": gguf_models.mixture_of_experts(root / "mixtral", "mixtral"),
    }
    hf_models.edit_config(root / "gpt2", n_ctx=64)  # llama.cpp's GPT-2 converter reads n_ctx
    jobs = [{"source": str(root / name), "out": str(root / f"{name}.gguf"), "type": "f32"} for name in peers]
    for kind in ("f16", "bf16", "q8_0"):
        jobs.append({"source": str(root / "llama"), "out": str(root / f"llama_{kind}.gguf"), "type": kind})
    (root / "split").mkdir()
    split = str(root / "split" / "llama.gguf")
    jobs.append({"source": str(root / "llama"), "out": split, "type": "f32", "extra": ["--split-max-tensors", "8"]})
    gguf_models.convert(jobs)
    files = {name: (root / f"{name}.gguf", peer) for name, peer in peers.items()}
    for kind in ("f16", "bf16", "q8_0"):
        files[f"llama_{kind}"] = (root / f"llama_{kind}.gguf", peers["llama"])
    for kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        gguf_models.requantize(root / "llama.gguf", root / f"llama_{kind.lower()}.gguf", kind)
        files[f"llama_{kind.lower()}"] = (root / f"llama_{kind.lower()}.gguf", peers["llama"])
    files["split"] = (sorted((root / "split").glob("*.gguf"))[0], peers["llama"])
    return files
