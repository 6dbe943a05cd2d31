"""GGUF files written by llama.cpp's own converter (`convert_hf_to_gguf.py`), the independent writer the GGUF tests
read: random small transformers models (tests/convert/hf_models.py) converted by it, in one child process.

The converter ships in the `llama-cpp-python` source distribution (vendor/llama.cpp/: the script, its
`conversion/` package and the gguf-py it is written against). `llama_cpp()` fetches it from the package index with
`pip download --no-binary` (no compiling) the first time, and keeps the three parts under
.venv/llama.cpp-<version>/ for later runs (a lock file makes parallel test workers wait for one download).

One change is made to the converter, in the child only: llama.cpp recognises a BPE vocabulary's pre-tokenizer by
hashing its tokens of a test text, which no random vocabulary matches, so the pre-tokenizer's name is given
(`get_vocab_base_pre`); the weights and every other metadata key are the converter's own.
"""

import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import gguf
import sentencepiece
import torch
import transformers

from tests.convert import hf_models

VERSION = "0.3.36"
PACKAGE = f"llama-cpp-python=={VERSION}"
_ROOT = Path(__file__).resolve().parents[2]
_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

_DRIVER = """
import json, runpy, sys
from pathlib import Path
root, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
sys.path.insert(0, str(root)); sys.path.insert(1, str(root / "gguf-py"))
import conversion.base as base
for job in jobs:
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer, pre=job["pre"]: pre
    sys.argv = ["convert_hf_to_gguf.py", job["source"], "--outfile", job["out"], "--outtype", job["type"]]
    sys.argv += job["extra"]
    runpy.run_path(str(root / "convert_hf_to_gguf.py"), run_name="__main__")
"""


def llama_cpp():
    """The folder holding llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py/ (fetched once)."""
    target = Path(os.environ.get("KERAS_TRANSFORMER_LLAMA_CPP", _ROOT / ".venv" / f"llama.cpp-{VERSION}"))
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "convert_hf_to_gguf.py").is_file():
            _fetch(target)
    return target


def _fetch(target):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                PACKAGE,
                "-d",
                tmp,
            ],
            check=True,
        )
        (archive,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        staging = Path(tmp) / "llama.cpp"
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(tuple(prefix + p for p in _PARTS))]
            for member in members:
                member.name = member.name[len(prefix) :]
            tar.extractall(staging, members=members, filter="data")
        shutil.move(str(staging), str(target))


def convert(jobs):
    """Run llama.cpp's converter on each job {source, out, type (f32/f16/bf16/q8_0), pre, extra (arguments)}."""
    jobs = [{"pre": "gpt-2", "extra": [], **job} for job in jobs]
    env = {key: value for key, value in os.environ.items() if key != "NO_LOCAL_GGUF"}  # the converter's own gguf-py
    result = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(llama_cpp()), json.dumps(jobs)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"llama.cpp's convert_hf_to_gguf.py failed:\n{result.stderr[-3000:]}")


def _sentencepiece(directory):
    """A SentencePiece BPE tokenizer.model with byte fallback (400 pieces), trained here and saved in `directory`."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(hf_models.TEXTS * 5),
        model_writer=model,
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        minloglevel=2,
    )
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / "tokenizer.model").write_bytes(model.getvalue())


SMALL = dict(
    vocab_size=400,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    attn_implementation="eager",
)


def sentencepiece_llama(directory, seed=0):
    """A random LlamaForCausalLM with a Llama-2-style SentencePiece BPE tokenizer.model (byte fallback), which
    llama.cpp's converter writes as tokenizer.ggml.model "llama" (tokens, scores, token types; no merges)."""
    _sentencepiece(directory)
    peer = hf_models.randomize(transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)), seed)
    peer.save_pretrained(directory)
    return peer


def phi3(directory, seed=0):
    """A random Phi3ForCausalLM (fused qkv_proj and gate_up_proj, half of each head rotated, a window of 16) with a
    SentencePiece tokenizer.model (llama.cpp's Phi-3 converter reads only that)."""
    _sentencepiece(directory)
    config = transformers.Phi3Config(
        **{**SMALL, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1},
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        sliding_window=16,
        pad_token_id=2,
    )
    peer = hf_models.randomize(transformers.Phi3ForCausalLM(config), seed)
    peer.save_pretrained(directory)
    return peer


def gemma3(directory, seed=0):
    """A random Gemma3ForCausalLM as llama.cpp runs one: both layers windowed (4; llama.cpp's layers are global only
    every 6th), queries scaled by 1 / sqrt(head size 16), a SentencePiece tokenizer.model; norms around 0 (Gemma
    scales by 1 + w) and a smaller embedding (times sqrt(D))."""
    _sentencepiece(directory)
    config = transformers.Gemma3TextConfig(
        **SMALL,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention"],
        pad_token_id=0,
    )
    peer = hf_models.randomize(transformers.Gemma3ForCausalLM(config), seed)
    with torch.no_grad():
        for name, parameter in peer.named_parameters():
            if "norm" in name:
                parameter.sub_(1.0)
            elif "embed_tokens" in name:
                parameter.mul_(0.3)
    peer.save_pretrained(directory)
    return peer


def mixture_of_experts(directory, model_type, seed=0):
    """A random Qwen3MoeForCausalLM (every layer routed: llama.cpp's qwen3moe has no dense layers) or
    MixtralForCausalLM, 2 of 4 experts, with the byte-level BPE tokenizer of hf_models."""
    options = {
        "qwen3_moe": dict(head_dim=16, num_experts=4, moe_intermediate_size=16, norm_topk_prob=True),
        "mixtral": dict(num_local_experts=4),
    }[model_type]
    config_cls, model_cls = {
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    }[model_type]
    tokenizer = hf_models.BytePairTokenizer.train(hf_models.TEXTS, vocabulary_size=300)
    special = {"vocab_size": 300, "bos_token_id": 0, "eos_token_id": 0}
    config = config_cls(**{**SMALL, **special}, num_experts_per_tok=2, **options)
    peer = hf_models.randomize(model_cls(config), seed)
    peer.save_pretrained(directory)
    hf_models.save_hf_tokenizer(tokenizer, directory, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    return peer


def requantize(source, target, kind):
    """A copy of the GGUF file `source` whose matrices are quantized to `kind` (e.g. Q4_1) by the gguf package's
    own quantizer (1-D tensors stay F32, as llama.cpp writes them); every metadata key is copied."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        qtype = gguf.GGMLQuantizationType[kind] if array.ndim == 2 else gguf.GGMLQuantizationType.F32
        writer.add_tensor(tensor.name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def rewrite(source, target, architecture=None, drop=(), add=None, tensors=None):
    """A copy of the GGUF file `source` with its architecture renamed (its `{arch}.` keys too), metadata keys
    dropped or added ({key: (value, gguf.GGUFValueType)}), and tensors added ({name: float32 array}): the damaged
    files of the refusal tests, written by the gguf package."""
    reader = gguf.GGUFReader(source)
    old = reader.fields["general.architecture"].contents()
    architecture = architecture or old
    writer = gguf.GGUFWriter(str(target), architecture)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop:
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        renamed = architecture + name[len(old) :] if name.startswith(old + ".") else name
        writer.add_key_value(renamed, field.contents(), field.types[0], sub_type=sub_type)
    for name, (value, kind) in (add or {}).items():
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
