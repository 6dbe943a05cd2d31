"""Speculative decoding by prompt lookup (or, with --draft, a draft model) against plain greedy decoding, same model,
same run (issue 41).

    KERAS_BACKEND=jax python benchmarks/speculative_speed.py [--preset llama_stdlib] [--repeats 7]
    python benchmarks/speculative_speed.py --backends jax,tensorflow,torch   # each backend in a child, one table
    python benchmarks/speculative_speed.py --draft llama_stdlib_draft --backends jax,tensorflow,torch
    KERAS_BACKEND=torch python benchmarks/speculative_speed.py --shape smollm2_135m --dtype bfloat16  # a GPU row

Batch 1, greedy, no stop token, on a trained preset (`llama_stdlib` by default, `gpt_stdlib`): a copy-heavy
prompt, a block of imports written three times and begun a fourth, which the greedy continuation repeats
line by line (`import os`, a line of the prompt), up to the presets' 128 positions. Tokens per second of
`generate(prompt_lookup_num_tokens=K)` for each K against plain `generate`, the calls alternating for
`--repeats` rounds after untimed compiling calls (`timing.paired`): the ratio of the best times, and the
median of the rounds' ratios (on a shared, loaded machine the best times are the steadier). Also the verify
passes per call and the tokens each accepted. The outputs are checked equal.

`--shape` (`make gpu-check`'s row; `tiny` checks it on a CPU): a model of `decode_gpu.py`'s shape with random
weights, no tokenizer: a 16-token random sequence written four times and begun a fifth as the prompt, 128 new
tokens; prompt lookup (K = 5), and a 2-layer draft of the same vocabulary and width (random too, so its
acceptance says nothing; its pass cost does). Each row gives the verify pass's cost in plain steps and the
break-even acceptance, which hold for trained weights too; the acceptance itself is the random model's own.
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


def count_passes():
    """A list that every later speculative call appends its verify passes to (generate's `speculative_decode`
    wrapped, for the rest of the process)."""
    module = importlib.import_module("keras_transformer.decoding.generate")
    passes, speculative_decode = [], module.speculative_decode

    def counted(*args, **kwargs):
        outputs = speculative_decode(*args, **kwargs)
        passes.append(int(outputs["steps"]))
        return outputs

    module.speculative_decode = counted
    return passes


def measure(preset, repeats):
    """{K: (ratio, tokens/s speculative, tokens/s plain, verify passes)} for one backend, and the token count."""
    import keras_transformer as kt

    lm = kt.models.CausalLM.from_preset(preset)
    prompt_tokens = len(lm.preprocessor.generate_preprocess([PROMPT])[0])
    new_tokens = lm.backbone.max_sequence_length - prompt_tokens - 2
    passes = count_passes()
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


DRAFT_PROMPT = "def __init__(self"


def expected_tokens(alpha, k):
    """Tokens a verify pass yields when each of its K drafts is accepted with probability alpha, independently:
    (1 - alpha^(K+1)) / (1 - alpha) (Leviathan et al.)."""
    return k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def break_even(ratio_of_costs, k):
    """The acceptance rate at which a pass's cost (in plain steps) buys as many tokens: solves
    expected_tokens(alpha, K) = ratio_of_costs by bisection (None when even alpha = 1 cannot)."""
    if ratio_of_costs > k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if expected_tokens(middle, k) < ratio_of_costs else (low, middle)
    return (low + high) / 2


def measure_draft(preset, draft_preset, repeats):
    """{K: (ratio, tokens/s speculative, tokens/s plain, verify passes, acceptance, break-even)} for a draft model,
    on a plain prompt (`DRAFT_PROMPT`), batch 1, greedy."""
    import keras_transformer as kt

    lm = kt.models.CausalLM.from_preset(preset)
    draft = kt.models.CausalLM.from_preset(draft_preset)
    prompt_tokens = len(lm.preprocessor.generate_preprocess([DRAFT_PROMPT])[0])
    new_tokens = lm.backbone.max_sequence_length - prompt_tokens - 2
    passes = count_passes()
    plain = lm.generate(DRAFT_PROMPT, max_new_tokens=new_tokens, stop_token_ids=None)
    results = {}
    for k in DRAFTS:

        def speculative(k=k):
            return lm.generate(
                DRAFT_PROMPT, max_new_tokens=new_tokens, stop_token_ids=None, draft_model=draft, num_draft_tokens=k
            )

        assert speculative() == plain, "the draft model changed the greedy tokens"
        _, best, per_round = paired(
            [lambda: lm.generate(DRAFT_PROMPT, max_new_tokens=new_tokens, stop_token_ids=None), speculative], repeats
        )
        ratio = float(np.median([p / s for p, s in zip(*per_round)]))
        steps = passes[-1]
        acceptance = (new_tokens / steps - 1.0) / k  # accepted drafts per proposed draft
        pass_cost = (best[1] / steps) / (best[0] / new_tokens)  # one pass, in plain steps
        results[k] = (
            best[0] / best[1],
            ratio,
            new_tokens / best[1],
            new_tokens / best[0],
            steps,
            acceptance,
            break_even(pass_cost, k),
        )
    return {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "K": results}


def print_draft_table(preset, draft_preset, rows):
    first = next(iter(rows.values()))
    print(
        f"{preset} with draft {draft_preset}, batch 1, greedy: {first['prompt_tokens']} prompt tokens, "
        f"{first['new_tokens']} new"
    )
    print(
        "| backend | K | plain tokens/s | draft tokens/s | ratio (best) | ratio (median) | passes | acceptance "
        "| break-even acceptance |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for backend, row in rows.items():
        for k, (ratio, median, fast, slow, steps, acceptance, even) in row["K"].items():
            even = "none (> 1)" if even is None else f"{even:.2f}"
            print(
                f"| {backend} | {k} | {slow:.0f} | {fast:.0f} | {ratio:.2f}x | {median:.2f}x | {steps} "
                f"| {acceptance:.2f} | {even} |"
            )


def measure_shape(shape, dtype, repeats):
    """Rows [(proposer, K, plain tokens/s, speculative tokens/s, passes, pass cost in plain steps, break-even,
    the new tokens equal to plain greedy's before the first that differs)] for a random model of
    `decode_gpu.SHAPES[shape]`, batch 1, greedy (see the module docstring)."""
    import keras

    import keras_transformer as kt
    from decode_gpu import SHAPES, Ours

    lm = Ours(shape, dtype).lm
    config = {**SHAPES[shape], "num_layers": 2}
    keras.utils.set_random_seed(1)
    draft = kt.models.LlamaCausalLM(kt.models.LlamaBackbone(**config, dtype=dtype))
    period = np.random.default_rng(0).integers(1, config["vocabulary_size"], 16).tolist()
    prompt, new = [period * 4 + period[:8]], 128
    passes, rows = count_passes(), []
    plain = lm.generate(prompt, max_new_tokens=new, stop_token_ids=None)
    cases = [("prompt lookup", {"prompt_lookup_num_tokens": 5}), ("draft (2 layers)", {"draft_model": draft})]
    for name, extra in cases:
        k = extra.get("prompt_lookup_num_tokens", 5)

        def speculative(extra=extra):
            return lm.generate(prompt, max_new_tokens=new, stop_token_ids=None, **extra)

        # In 16 bits a pass of K + 1 tokens rounds otherwise than K + 1 one-token steps: a near tie may go the other
        # way (transformers' assisted generation alike). The tokens that agree are reported, not asserted.
        ours = speculative()[0]
        same = next((j for j, (a, b) in enumerate(zip(ours, plain[0])) if a != b), len(ours)) - len(prompt[0])
        _, best, _ = paired(
            [lambda: lm.generate(prompt, max_new_tokens=new, stop_token_ids=None), speculative], repeats
        )
        cost = (best[1] / passes[-1]) / (best[0] / new)  # one pass (proposals included), in plain steps
        rows.append((name, k, new / best[0], new / best[1], passes[-1], cost, break_even(cost, k), same))
    return rows


def print_shape_table(shape, dtype, rows):
    import keras

    print(f"{shape} (random weights), {dtype}, {keras.config.backend()}, batch 1, greedy: 72 prompt tokens, 128 new")
    print(
        "| proposer | K | plain tokens/s | speculative tokens/s | ratio | passes | tokens/pass | pass cost (steps) "
        "| break-even acceptance | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, k, slow, fast, steps, cost, even, same in rows:
        even = "none (> 1)" if even is None else f"{even:.2f}"
        print(
            f"| {name} | {k} | {slow:.0f} | {fast:.0f} | {fast / slow:.2f}x | {steps} | {128 / steps:.1f} "
            f"| {cost:.2f} | {even} | {same} / 128 |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama_stdlib")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backends", default=None, help="comma-separated: run each in a child process")
    parser.add_argument("--json", action="store_true", help="print the measurement as JSON (the children's form)")
    parser.add_argument("--draft", default=None, help="a draft preset (llama_stdlib_draft): draft-model speculation")
    parser.add_argument("--shape", default=None, help="decode_gpu.py's shape, random weights (smollm2_135m, tiny)")
    parser.add_argument("--dtype", default="float32", help="with --shape: float32 or bfloat16")
    args = parser.parse_args()
    if args.shape:
        return print_shape_table(args.shape, args.dtype, measure_shape(args.shape, args.dtype, min(args.repeats, 5)))
    if args.backends:
        rows = {}
        for backend in args.backends.split(","):
            command = [sys.executable, __file__, "--preset", args.preset, "--repeats", str(args.repeats), "--json"]
            command += ["--draft", args.draft] if args.draft else []
            env = {**os.environ, "KERAS_BACKEND": backend}
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            rows[backend] = json.loads(done.stdout.strip().splitlines()[-1])
    else:
        import keras

        if args.draft:
            rows = {keras.config.backend(): measure_draft(args.preset, args.draft, args.repeats)}
        else:
            rows = {keras.config.backend(): measure(args.preset, args.repeats)}
        if args.json:
            print(json.dumps(rows[keras.config.backend()]))
            return
    if args.draft:
        return print_draft_table(args.preset, args.draft, rows)
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
