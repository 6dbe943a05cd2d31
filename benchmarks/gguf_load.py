"""GGUF export and load at the SmolLM2-135M shape (random weights made here; nothing is downloaded).

The parent builds `smollm2_135m` (30 layers, d 576, vocabulary 49152, tied head), exports it once per
`gguf_type` and times each export. Each load then runs in a fresh child process, which reports the seconds of
`CausalLM.from_preset(file)`, the child's peak resident memory and its peak before the load (Keras, the backend and
keras_transformer imported, a tiny model built so the backend is warm); with `--transformers`, the same for
transformers' `AutoModelForCausalLM.from_pretrained(..., gguf_file=...)` (PyTorch).

    KERAS_BACKEND=jax python benchmarks/gguf_load.py [--types f32 f16 q8_0 q4_0] [--transformers]

Results go to benchmarks/RESULTS.md by hand ("GGUF").
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_rss_gb():
    """This process's peak resident memory (VmHWM: ru_maxrss would carry the parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # KiB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(path, reader):
    """Load `path` once; print {"seconds", "peak_gb", "baseline_gb"} (peak resident memory, before the load) as JSON."""
    if reader == "ours":
        from keras_transformer.models import CausalLM

        CausalLM.from_preset("llama_tiny")  # the backend warm, as a user's process would be
        load = lambda: CausalLM.from_preset(path)  # noqa: E731
    else:
        import torch
        import transformers

        load = lambda: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
            Path(path).parent, gguf_file=Path(path).name, dtype=torch.float32
        )
    baseline = peak_rss_gb()
    start = time.perf_counter()
    model = load()
    seconds = time.perf_counter() - start
    del model
    print(json.dumps({"seconds": seconds, "peak_gb": peak_rss_gb(), "baseline_gb": baseline}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=["f32", "f16", "q8_0", "q4_0"])
    parser.add_argument("--transformers", action="store_true", help="also time transformers' GGUF loader")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "READER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    from keras_transformer.models import CausalLM

    lm = CausalLM.from_preset("smollm2_135m")
    weights_gb = round(lm.count_params() * 4 / 2**30, 2)
    print(f"backend {os.environ.get('KERAS_BACKEND')}, {lm.count_params():,} parameters, float32 weights {weights_gb}")
    with tempfile.TemporaryDirectory() as tmp:
        for gguf_type in args.types:
            path = Path(tmp) / f"smollm2_135m_{gguf_type}.gguf"
            start = time.perf_counter()
            lm.export(path, format="gguf", gguf_type=gguf_type)
            export_seconds = time.perf_counter() - start
            row = {"type": gguf_type, "file_mb": round(path.stat().st_size / 2**20, 1), "export_s": export_seconds}
            for reader in ["ours"] + (["transformers"] if args.transformers else []):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(path), reader], capture_output=True, text=True, check=True
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                row[f"{reader}_load_s"] = round(result["seconds"], 2)
                row[f"{reader}_peak_gb"] = round(result["peak_gb"], 2)
                row[f"{reader}_baseline_gb"] = round(result["baseline_gb"], 2)
            print(json.dumps(row))


if __name__ == "__main__":
    main()
