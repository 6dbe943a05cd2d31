"""A sparse mixture of experts against a dense model of the same active size, in one run (issue 39).

    KERAS_BACKEND=jax python benchmarks/moe_speed.py
    KERAS_BACKEND=torch python benchmarks/moe_speed.py [--repeats 5] [--shape tiny] [--parts fit]
    KERAS_BACKEND=jax python benchmarks/moe_speed.py --shape gpu --repeats 2   # in `make gpu-check`

Shape ("small", the default): a LlamaBackbone of 4 layers, width 512, 8 heads, 2 key/value heads, vocabulary
8000. The MoE model's every feed-forward is E = 16 experts of width 1024 with k = 2 per token; the dense model's a
SwiGLU of width 2048 (two experts' worth: the same active parameters per token). Random weights.
- decoding: greedy, batch 1, a 16-token prompt and 64 new tokens (no stop token); time per new token;
- `fit`: batches of 8 x 128 tokens, next-token loss, the task's default (compiled) train step; tokens/s.
The two models' calls alternate for `--repeats` rounds after untimed compiling calls; the ratios are the
medians of the rounds' ratios. Issue 39's targets: decoding MoE / dense at most 1.5; fit MoE / dense at least 0.5.
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import paired  # noqa: E402

SHAPES = {
    # name: (layers, width, heads, key/value heads, vocabulary, experts, k, expert width)
    "small": (4, 512, 8, 2, 8000, 16, 2, 1024),
    "tiny": (2, 64, 4, 2, 500, 16, 2, 64),
    # `make gpu-check`: the SmolLM2-135M shape (its dense feed-forward, 1536 wide, is two experts' worth)
    "gpu": (30, 576, 9, 3, 49152, 16, 2, 768),
}
PROMPT, NEW_TOKENS = 16, 64
BATCH, LENGTH = 8, 128


def build(shape, sparse):
    from keras_transformer.models.llama.llama_backbone import LlamaBackbone
    from keras_transformer.models.llama.llama_causal_lm import LlamaCausalLM

    layers, width, heads, kv_heads, vocabulary, experts, k, expert_width = SHAPES[shape]
    moe = dict(num_experts=experts, top_k=k, intermediate_dim=expert_width) if sparse else None
    backbone = LlamaBackbone(
        vocabulary_size=vocabulary,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=width,
        intermediate_dim=k * expert_width,
        num_key_value_heads=kv_heads,
        max_sequence_length=512,
        mixture_of_experts=moe,
    )
    lm = LlamaCausalLM(backbone=backbone)
    lm.compile(
        optimizer=keras.optimizers.AdamW(1e-4), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return lm


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", choices=("both", "decode", "fit"), default="both", help="what to time")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    moe, dense = build(args.shape, True), build(args.shape, False)
    vocabulary = SHAPES[args.shape][4]
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, vocabulary, (1, PROMPT)).astype("int32")

    def decode(lm):
        return lambda: lm.generate(prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=None)

    print(f"backend {keras.config.backend()}, shape {args.shape} {SHAPES[args.shape]}, {args.repeats} rounds")
    experts, k = SHAPES[args.shape][5:7]
    print(f"| | MoE (E={experts}, k={k}) | dense, same active size | MoE / dense | target |")
    print("|---|---:|---:|---:|---|")
    if args.parts != "fit":
        _, best, rounds = paired([decode(moe), decode(dense)], args.repeats)
        ratio = float(np.median([m / d for m, d in zip(*rounds)]))
        print(
            f"| decoding, greedy batch 1, ms per token | {1000 * best[0] / NEW_TOKENS:.2f} | "
            f"{1000 * best[1] / NEW_TOKENS:.2f} | {ratio:.2f} (time) | at most 1.5 |",
            flush=True,
        )
    if args.parts != "decode":
        fit(moe, dense, rng, vocabulary, args.repeats)


def fit(moe, dense, rng, vocabulary, repeats):
    """Print the `fit` row: tokens/s of both models, alternating, and the median of the rounds' ratios."""
    x = {
        "token_ids": rng.integers(0, vocabulary, (BATCH, LENGTH)).astype("int32"),
        "padding_mask": np.ones((BATCH, LENGTH), bool),
    }
    y = rng.integers(0, vocabulary, (BATCH, LENGTH)).astype("int32")

    def train(lm):
        return lambda: lm.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)

    _, fit_best, fit_rounds = paired([train(moe), train(dense)], repeats)
    fit_ratio = float(np.median([d / m for m, d in zip(*fit_rounds)]))  # tokens/s MoE / dense
    tokens = 2 * BATCH * LENGTH
    print(
        f"| `fit`, tokens/s | {tokens / fit_best[0]:.0f} | {tokens / fit_best[1]:.0f} | {fit_ratio:.2f} (speed) "
        "| at least 0.5 |"
    )


if __name__ == "__main__":
    main()
