"""Kernels per decoding step on a GPU: ours vs keras-hub's GPT loop, from XLA's optimized HLO (JAX only).

    KERAS_BACKEND=jax python benchmarks/step_kernels.py [--dump DIR]

Both models of `generate.py` (GPT, 4 layers, d 256, vocabulary 8000). Runs greedy at batch 4 and
beam search (4 beams) at batch 1 (the same 4-row forward), 128 new tokens, each timed alone (best
of 5 after a compiling call), with `--xla_dump_to` set; then reads every loop body of the dumped
optimized modules and counts the instructions that launch work on the device (fusions, custom
calls, copies), by kind. On a GPU a decoding step of this size costs about its kernel launches,
so the counts explain the times. The device run in RESULTS ("GPU") used this script.
"""

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
from pathlib import Path

LAUNCH_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


def loop_kernels(text):
    """{while body name: Counter of 'op:kind'} for one optimized HLO module's text."""
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^%?([\w.\-]+) [^\n]*\{\n(.*?)^\}", text, re.S | re.M)}
    counts = {}
    for body in re.findall(r"while\([^)]*\), condition=%?[\w.\-]+, body=%?([\w.\-]+)", text):
        ops = collections.Counter()
        for line in bodies.get(body, "").splitlines():
            m = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = \S+ (\w[\w\-]*)\(", line)
            if m and m.group(1) not in LAUNCH_FREE:
                kind = re.search(r"kind=(\w+)", line)
                ops[m.group(1) + (":" + kind.group(1) if kind else "")] += 1
        counts[body] = ops
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", default=None, help="where XLA writes its HLO (default: a temporary folder)")
    args = parser.parse_args()
    dump = args.dump or tempfile.mkdtemp()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
    ).strip()
    import keras
    import numpy as np

    if keras.config.backend() != "jax":
        raise SystemExit("step_kernels.py reads XLA's HLO dumps of JAX loops: run it with KERAS_BACKEND=jax.")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import generate
    from timing import paired

    prompt = np.random.default_rng(1).integers(1, generate.SHAPE["vocabulary_size"], (1, generate.PROMPT))
    for model in (generate.Ours(), generate.KerasHub()):
        for beams, prompts in ((1, np.repeat(prompt, 4, 0)), (4, prompt)):
            _, (best,), _ = paired([lambda: model.generate(prompts, generate.NEW_TOKENS, beams)], 5)
            case = "greedy batch 4" if beams == 1 else "beam-4 batch 1"
            print(f"{model.name:<10} {case}: {best / generate.NEW_TOKENS * 1e3:.3f} ms/step", flush=True)
    for path in sorted(glob.glob(os.path.join(dump, "*after_optimizations.txt")), key=os.path.getsize, reverse=True):
        for body, ops in loop_kernels(Path(path).read_text()).items():
            if sum(ops.values()) > 20:  # the decoding loops, not the small helper loops
                print(f"{os.path.basename(path)[:60]} {body}: {sum(ops.values())} kernels {dict(ops.most_common())}")


if __name__ == "__main__":
    main()
