"""Our generation speed at two source trees, side by side in one run: did a change lose speed?

    KERAS_BACKEND=jax python benchmarks/revisions.py /tmp/base        # /tmp/base: `git worktree add /tmp/base REV`
    KERAS_BACKEND=torch python benchmarks/revisions.py /tmp/base --repeats 7

One child process per tree (this checkout, and the tree named), each importing keras_transformer from its own
tree (`sys.path[0]`, ahead of the editable install; each child prints the file it imported). Both build the
same models from the same seed: the GPT of benchmarks/generate.py (4 layers, d 256, vocabulary 8000; prompts
of 16 tokens, 128 new) and the T5 of benchmarks/generate_seq2seq.py (4 + 4 layers, d 256; sources of 32, 64
new). The parent asks the two children for one timed call in turn, `--repeats` rounds after two untimed calls
each (compilation), so that this machine's drift hits both alike. It prints each tree's best tokens/s and the
median of the rounds' ratios (base time / this tree's time: above 1, this tree is faster), and checks that
the two trees return the same tokens.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = Path(__file__).resolve()
GPT = dict(vocabulary_size=8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)
T5 = dict(num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, key_dim=64, activation="gated-gelu")
# (name, family, batch, beams, prompt length, new tokens)
CASES = [
    ("GPT greedy, batch 1", "gpt", 1, 1, 16, 128),
    ("GPT greedy, batch 8", "gpt", 8, 1, 16, 128),
    ("GPT beam-4, batch 1", "gpt", 1, 4, 16, 128),
    ("T5 greedy, batch 1", "t5", 1, 1, 32, 64),
]


def child(tree):
    """Serve timed calls over stdin/stdout: one JSON line in (a case index), one JSON line out."""
    sys.path.insert(0, tree)
    import keras

    import keras_transformer as kt

    keras.utils.set_random_seed(0)
    models = {
        "gpt": kt.models.GPTCausalLM(kt.models.GPTBackbone(**GPT, max_sequence_length=1024, dropout=0.0)),
        "t5": kt.models.T5Seq2SeqLM(kt.models.T5Backbone(8000, **T5, dropout=0.0, tie_embedding_weights=False)),
    }
    print(json.dumps({"imported": kt.__file__}), flush=True)
    for line in sys.stdin:
        _, family, batch, beams, prompt, new = CASES[json.loads(line)]
        tokens = np.random.default_rng(batch).integers(1, 8000, (batch, prompt))
        sampler = kt.samplers.GreedySampler() if beams == 1 else kt.samplers.BeamSampler(num_beams=beams)
        start = time.perf_counter()
        out = models[family].generate(tokens, max_new_tokens=new, sampler=sampler, stop_token_ids=None)
        seconds = time.perf_counter() - start
        out = keras.ops.convert_to_numpy(out)
        print(json.dumps({"seconds": seconds, "checksum": int(out.astype(np.int64).sum())}), flush=True)


class Child:
    def __init__(self, tree):
        self.process = subprocess.Popen(
            [sys.executable, str(HERE), "--child", str(tree)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.imported = self.read()["imported"]

    def read(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the child for {self.process.args[-1]} ended (exit {self.process.wait()})")
        return json.loads(line)

    def call(self, case):
        self.process.stdin.write(f"{case}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "base", nargs="?", help="the other source tree (e.g. a `git worktree` of the revision to compare)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if args.base is None:
        parser.error("the base tree is required")
    import keras

    trees = {"this tree": HERE.parents[1], "base": Path(args.base).resolve()}
    children = {name: Child(tree) for name, tree in trees.items()}
    for name, process in children.items():
        print(f"{name}: {trees[name]} (imports {process.imported})")
    print(f"backend {keras.config.backend()}, {args.repeats} alternating rounds; ratio = base time / this tree's time")
    print(f"{'case':<22}{'this tok/s':>12}{'base tok/s':>12}{'ratio':>8}  (best rounds; median ratio)")
    for index, (case, _, batch, _, _, new) in enumerate(CASES):
        for _ in range(2):  # compile, then what a first call runs eagerly
            checks = {name: process.call(index)["checksum"] for name, process in children.items()}
        if len(set(checks.values())) != 1:
            raise AssertionError(f"{case}: the two trees return different tokens ({checks})")
        rounds = [[children[name].call(index)["seconds"] for name in trees] for _ in range(args.repeats)]
        ours, base = zip(*rounds)
        ratio = float(np.median([b / o for o, b in rounds]))
        print(f"{case:<22}{batch * new / min(ours):>12.0f}{batch * new / min(base):>12.0f}{ratio:>8.2f}", flush=True)
    for process in children.values():
        process.close()


if __name__ == "__main__":
    main()
