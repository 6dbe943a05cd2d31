"""`from_preset` at a real size: seconds and peak memory of loading a preset folder and a Hugging Face folder.

A child process builds `--model` (a registered preset's shape, random weights; nothing is downloaded) and writes it
twice: as our preset (`save_to_preset`) and as a Hugging Face folder (`export(format="huggingface")`). Each load
then runs in a fresh child process on the current backend, which reports the seconds of
`CausalLM.from_preset(folder)`, its peak resident memory (VmHWM) and its resident memory before the load (Keras, the
backend and keras_transformer imported). Each load is run two ways, side by side: as `from_preset` builds now
(keras_transformer/presets/initialization.py: on JAX and PyTorch, no random initial values are drawn before the
weights load) and the usual way (built with random values, then assigned), forced by replacing
`defers_initialization`. With `--transformers` (any backend), also transformers' `AutoModelForCausalLM
.from_pretrained` of the Hugging Face folder (PyTorch, float32).

    KERAS_BACKEND=jax python benchmarks/load_speed.py [--model smollm2_135m] [--repeats 2] [--transformers]

Results go to benchmarks/RESULTS.md by hand ("from_preset without random initial values").
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRITE = """
import sys
from keras_transformer.export import load_preset_task
lm = load_preset_task(sys.argv[1], load_weights=False)
lm.save_to_preset(sys.argv[2])
lm.export(sys.argv[3], format="huggingface")
"""

LOAD = """
import json, sys, time
from pathlib import Path
status = lambda field: next(int(l.split()[1]) / 2**20 for l in Path("/proc/self/status").read_text().splitlines()
                            if l.startswith(field))  # GB
folder, way = sys.argv[1], sys.argv[2]
if way == "transformers":
    from transformers import AutoModelForCausalLM
    load = lambda: AutoModelForCausalLM.from_pretrained(folder, torch_dtype="float32")
else:
    from keras_transformer.models import CausalLM
    from keras_transformer.presets import initialization
    if way == "usual":
        initialization.defers_initialization = lambda quantized: False
    load = lambda: CausalLM.from_preset(folder)
before = status("VmRSS:")
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"seconds": seconds, "peak": status("VmHWM:"), "before": before}))
"""


def run(code, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :]) if lines else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--repeats", type=int, default=2, help="loads per way (fresh processes); the best is shown")
    parser.add_argument("--transformers", action="store_true")
    args = parser.parse_args()
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    with tempfile.TemporaryDirectory(prefix="load_speed_") as scratch:
        folders = {"preset": Path(scratch) / "preset", "huggingface": Path(scratch) / "hf"}
        run(WRITE, args.model, folders["preset"], folders["huggingface"])
        rows = [(kind, way) for kind in folders for way in ("now", "usual")]
        rows += [("huggingface", "transformers")] if args.transformers else []
        for kind, way in rows:
            results = [run(LOAD, folders[kind], way) for _ in range(args.repeats)]
            best = min(results, key=lambda r: r["seconds"])
            every = ", ".join(f"{r['seconds']:.2f}" for r in results)
            print(
                f"{args.model} {kind:<11} {backend:<10} {way:<12} {best['seconds']:6.2f} s "
                f"(all: {every}), peak {best['peak']:.2f} GB "
                f"(before {best['before']:.2f} GB)",
                flush=True,
            )


if __name__ == "__main__":
    main()
