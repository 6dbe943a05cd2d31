"""GGUF export and load at the SmolLM2-135M shape (random weights made here; nothing is downloaded).

Each export runs in a fresh child process, which builds `smollm2_135m` (30 layers, d 576, vocabulary 49152, tied
head) and reports the export's seconds, the child's peak resident memory and its peak before the export (the model
built). Each load then runs in a fresh child process, which reports the seconds of `CausalLM.from_preset(file)`, the
child's peak resident memory, its resident memory after the load and its peak before the load (Keras, the backend and
keras_transformer imported, a tiny model built so the backend is warm); q4_0 files are loaded float and with
`quantize="int4"` (their Q4_0 blocks kept in Keras's int4 layers); with `--transformers`, the same for transformers'
`AutoModelForCausalLM.from_pretrained(..., gguf_file=...)` (PyTorch).

    KERAS_BACKEND=jax python benchmarks/gguf_load.py [--types f32 f16 q8_0 q4_0] [--transformers] [--export-only]

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


def rss_gb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20  # KiB
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def export_child(path, gguf_type):
    """Build smollm2_135m and export it to `path`; print {"seconds", "peak_gb", "baseline_gb"} as JSON."""
    from keras_transformer.models import CausalLM

    lm = CausalLM.from_preset("smollm2_135m")
    baseline = peak_rss_gb()
    start = time.perf_counter()
    lm.export(path, format="gguf", gguf_type=gguf_type)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_gb": peak_rss_gb(), "baseline_gb": baseline}))


def child(path, reader):
    """Load `path` once; print {"seconds", "peak_gb", "rss_gb", "baseline_gb"} (peak resident memory, resident memory
    after the load, peak before it) as JSON. `reader`: "ours", "ours_int4" (quantize="int4") or "transformers"."""
    if reader.startswith("ours"):
        from keras_transformer.models import CausalLM

        CausalLM.from_preset("llama_tiny")  # the backend warm, as a user's process would be
        quantize = "int4" if reader == "ours_int4" else None
        load = lambda: CausalLM.from_preset(path, quantize=quantize)  # noqa: E731
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
    resident = rss_gb()
    del model
    print(json.dumps({"seconds": seconds, "peak_gb": peak_rss_gb(), "rss_gb": resident, "baseline_gb": baseline}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=["f32", "f16", "q8_0", "q4_0"])
    parser.add_argument("--transformers", action="store_true", help="also time transformers' GGUF loader")
    parser.add_argument("--export-only", action="store_true", help="time and measure the exports only")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "READER"), help=argparse.SUPPRESS)
    parser.add_argument("--export-child", nargs=2, metavar=("PATH", "TYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    if args.export_child:
        return export_child(*args.export_child)
    print(f"backend {os.environ.get('KERAS_BACKEND')}, smollm2_135m: 134,515,008 parameters, float32 weights 0.50 GB")
    with tempfile.TemporaryDirectory() as tmp:
        for gguf_type in args.types:
            path = Path(tmp) / f"smollm2_135m_{gguf_type}.gguf"
            result = _run("--export-child", str(path), gguf_type)
            row = {"type": gguf_type, "file_mb": round(path.stat().st_size / 2**20, 1)}
            row.update({f"export_{key}": round(value, 2) for key, value in result.items()})
            readers = ["ours"] + (["ours_int4"] if gguf_type == "q4_0" else []) + ["transformers"] * args.transformers
            for reader in [] if args.export_only else readers:
                result = _run("--child", str(path), reader)
                row.update({f"{reader}_{key}": round(value, 2) for key, value in result.items()})
            print(json.dumps(row), flush=True)


def _run(*args):
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
