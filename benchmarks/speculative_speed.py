"""Speculative decoding by prompt lookup against plain greedy decoding, same model, same run (issue 41).

    KERAS_BACKEND=jax python benchmarks/speculative_speed.py [--preset llama_stdlib] [--repeats 7]
    python benchmarks/speculative_speed.py --backends jax,tensorflow,torch   # each backend in a child, one table

Batch 1, greedy, no stop token, on a trained preset (`llama_stdlib` by default, `gpt_stdlib`): a copy-heavy
prompt, a block of imports written three times and begun a fourth, which the greedy continuation repeats
line by line (`import os`, a line of the prompt), up to the presets' 128 positions. Tokens per second of
`generate(prompt_lookup_num_tokens=K)` for each K against plain `generate`, the calls alternating for
`--repeats` rounds after untimed compiling calls (`timing.paired`): the ratio of the best times, and the
median of the rounds' ratios (on a shared, loaded machine the best times are the steadier). Also the verify
passes per call and the tokens each accepted. The outputs are checked equal.
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import paired  # noqa: E402

PROMPT = "import os\nimport sys\nimport re\nimport json\n" * 3 + "import"
DRAFTS = (3, 5, 8)


def measure(preset, repeats):
    """{K: (ratio, tokens/s speculative, tokens/s plain, verify passes)} for one backend, and the token count."""
    import keras_transformer as kt

    lm = kt.models.CausalLM.from_preset(preset)
    prompt_tokens = len(lm.preprocessor.generate_preprocess([PROMPT])[0])
    new_tokens = lm.backbone.max_sequence_length - prompt_tokens - 2
    module = importlib.import_module("keras_transformer.decoding.generate")
    passes, speculative_decode = [], module.speculative_decode

    def counted(*args, **kwargs):
        outputs = speculative_decode(*args, **kwargs)
        passes.append(int(outputs["steps"]))
        return outputs

    module.speculative_decode = counted
    plain = lm.generate(PROMPT, max_new_tokens=new_tokens, stop_token_ids=None)
    results = {}
    for k in DRAFTS:

        def speculative(k=k):
            return lm.generate(PROMPT, max_new_tokens=new_tokens, stop_token_ids=None, prompt_lookup_num_tokens=k)

        assert speculative() == plain, "prompt lookup changed the greedy tokens"
        _, best, per_round = paired(
            [lambda: lm.generate(PROMPT, max_new_tokens=new_tokens, stop_token_ids=None), speculative], repeats
        )
        ratio = float(np.median([p / s for p, s in zip(*per_round)]))
        results[k] = (best[0] / best[1], ratio, new_tokens / best[1], new_tokens / best[0], passes[-1])
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "continuation": plain[len(PROMPT) :][:40],
        "K": results,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama_stdlib")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backends", default=None, help="comma-separated: run each in a child process")
    parser.add_argument("--json", action="store_true", help="print the measurement as JSON (the children's form)")
    args = parser.parse_args()
    if args.backends:
        rows = {}
        for backend in args.backends.split(","):
            command = [sys.executable, __file__, "--preset", args.preset, "--repeats", str(args.repeats), "--json"]
            env = {**os.environ, "KERAS_BACKEND": backend}
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            rows[backend] = json.loads(done.stdout.strip().splitlines()[-1])
    else:
        import keras

        rows = {keras.config.backend(): measure(args.preset, args.repeats)}
        if args.json:
            print(json.dumps(rows[keras.config.backend()]))
            return
    first = next(iter(rows.values()))
    print(f"{args.preset}, batch 1, greedy: {first['prompt_tokens']} prompt tokens, {first['new_tokens']} new")
    print(f"continuation: {first['continuation']!r}...")
    print("| backend | K | plain tokens/s | lookup tokens/s | ratio (best) | ratio (median) | passes | tokens/pass |")
    print("|---|---|---|---|---|---|---|---|")
    for backend, row in rows.items():
        for k, (ratio, median, fast, slow, steps) in row["K"].items():
            per_pass = row["new_tokens"] / steps
            print(
                f"| {backend} | {k} | {slow:.0f} | {fast:.0f} | {ratio:.2f}x | {median:.2f}x | {steps} "
                f"| {per_pass:.1f} |"
            )


if __name__ == "__main__":
    main()
