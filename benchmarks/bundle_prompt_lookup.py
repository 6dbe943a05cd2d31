"""Prompt lookup in the ONNX bundle against the bundle's plain greedy decoding, same bundle, same run (issue 41).

    python benchmarks/bundle_prompt_lookup.py [--preset gpt_stdlib] [--bundle DIR] [--repeats 7]

Exports the preset to an ONNX bundle (unless --bundle is given; its decode graph must be the ONNX kernels', whose
token axis is symbolic) and runs its Keras-free `Generator`: batch 1, greedy, no stop token, the copy-heavy prompt
of `speculative_speed.py` (a block of imports written three times and begun a fourth), up to the model's length.
Tokens per second of `generate_ids(prompt_lookup_num_tokens=K)` for each K against plain `generate_ids`, the calls
alternating for --repeats rounds (`timing.paired`): the ratio of the best times and the median of the rounds'
ratios, and the drafts kept of those checked. The outputs are checked equal.
"""

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speculative_speed import DRAFTS, PROMPT  # noqa: E402
from timing import paired  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt_stdlib")
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    bundle = args.bundle
    if bundle is None:
        import keras_transformer as kt

        bundle = kt.models.CausalLM.from_preset(args.preset).export(os.path.join(tempfile.mkdtemp(), "b"), "onnx")
    sys.path.insert(0, str(bundle))
    generator = importlib.import_module("generate").Generator(bundle)
    if not generator.multi_token:
        raise SystemExit(f"{bundle}'s decode graph takes one token per step (traced): no prompt lookup.")
    ids = [generator.encode(PROMPT)]
    new = int(generator.config["max_length"]) - len(ids[0])
    plain = generator.generate_ids(ids, new, stop_token_ids=None)
    print(f"{args.preset} bundle, batch 1, greedy: {len(ids[0])} prompt tokens, {new} new")
    print(f"continuation: {generator.tokenizer.decode(plain[0])[:60]!r}")
    for k in DRAFTS:

        def speculative(k=k):
            return generator.generate_ids(ids, new, stop_token_ids=None, prompt_lookup_num_tokens=k)

        assert speculative() == plain, "prompt lookup changed the greedy tokens"
        drafted, accepted = generator.prompt_lookup_counts[0]
        _, best, rounds = paired(
            [lambda: generator.generate_ids(ids, new, stop_token_ids=None), speculative], args.repeats
        )
        median = float(np.median([p / s for p, s in zip(*rounds)]))
        print(
            f"K={k}: plain {new / best[0]:.0f} tokens/s, prompt lookup {new / best[1]:.0f} tokens/s: "
            f"x{best[0] / best[1]:.2f} (best times), x{median:.2f} (median of rounds); {accepted} of {drafted} "
            "drafts kept"
        )


if __name__ == "__main__":
    main()
