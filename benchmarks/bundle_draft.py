"""A draft bundle in the ONNX bundle's runtime against the bundle's plain greedy decoding, same bundle, same run
(issue 41).

    python benchmarks/bundle_draft.py [--preset llama_stdlib] [--draft llama_stdlib_draft] [--repeats 7]

Exports both presets to ONNX bundles (the ONNX kernels' graphs, whose token axis is symbolic) and runs the target's
Keras-free `Generator`: batch 1, greedy, no stop token, `speculative_speed.py`'s draft prompt (`def __init__(self`),
up to the model's length. Tokens per second of `generate_ids(draft=..., num_draft_tokens=K)` for each K against
plain `generate_ids`, the calls alternating for --repeats rounds (`timing.paired`): the ratio of the best times and
the median of the rounds' ratios; the verify passes, the acceptance (drafts kept / drafts checked) and the
break-even acceptance (the rate at which a pass's measured cost, in plain steps, buys as many tokens:
`speculative_speed.break_even`). The outputs are checked equal.
"""

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speculative_speed import DRAFT_PROMPT, DRAFTS, break_even  # noqa: E402
from timing import paired  # noqa: E402


def export(preset):
    import keras_transformer as kt

    return kt.models.CausalLM.from_preset(preset).export(os.path.join(tempfile.mkdtemp(), preset), "onnx")


def measure(generator, draft, ids, new, k, repeats):
    """(ratio of best times, median ratio, draft tokens/s, plain tokens/s, passes, acceptance, break-even)."""

    def plain():
        return generator.generate_ids(ids, new, stop_token_ids=None)

    def speculative():
        return generator.generate_ids(ids, new, stop_token_ids=None, draft=draft, num_draft_tokens=k)

    assert speculative() == plain(), "the draft bundle changed the greedy tokens"
    drafted, accepted = generator.draft_counts[0]
    passes = new - 1 - accepted  # the first token comes from the prefill; a pass gives its kept drafts + 1
    _, best, rounds = paired([plain, speculative], repeats)
    pass_cost = (best[1] / passes) / (best[0] / new)  # one pass (K draft steps and a verify), in plain steps
    median = float(np.median([p / s for p, s in zip(*rounds)]))
    return best[0] / best[1], median, new / best[1], new / best[0], passes, accepted / drafted, break_even(pass_cost, k)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama_stdlib")
    parser.add_argument("--draft", default="llama_stdlib_draft")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    bundle, draft_bundle = export(args.preset), export(args.draft)
    sys.path.insert(0, str(bundle))
    runtime = importlib.import_module("generate")
    generator, draft = runtime.Generator(bundle), runtime.Generator(draft_bundle)
    ids = [generator.encode(DRAFT_PROMPT)]
    new = int(generator.config["max_length"]) - len(ids[0])
    print(
        f"{args.preset} bundle with draft bundle {args.draft}, batch 1, greedy: {len(ids[0])} prompt tokens, {new} new"
    )
    print(
        "| K | plain tokens/s | with draft tokens/s | ratio (best) | ratio (median) | passes | acceptance "
        "| break-even acceptance |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in DRAFTS:
        ratio, median, fast, slow, passes, acceptance, even = measure(generator, draft, ids, new, k, args.repeats)
        even = "none (> 1)" if even is None else f"{even:.2f}"
        print(
            f"| {k} | {slow:.0f} | {fast:.0f} | {ratio:.2f}x | {median:.2f}x | {passes} | {acceptance:.2f} | {even} |"
        )


if __name__ == "__main__":
    main()
