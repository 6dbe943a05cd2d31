"""Constrained decoding's cost in the bundle server's scheduler (issue 42): time per token with a JSON schema's
mask (llguidance) against the same decoding unconstrained, at batch 1 and with 8 concurrent sequences.

    python benchmarks/structured_speed.py [--bundle DIR] [--tokens 64] [--rounds 3]
    python benchmarks/structured_speed.py --keras [--tokens 64] [--rounds 3]    # lm.generate_constrained

Exports `smollm2_135m` (the SmolLM2-135M shape and its real 49,152-token tokenizer, random weights) to an ONNX
bundle unless --bundle is given, then runs the bundle's own `batching.Scheduler` in this process (what
`serve.py` runs, without HTTP): k sequences (k = 1, then 8 submitted together) of --tokens new tokens each,
unconstrained and under a schema whose answers cannot end within them (an array of at least 50 objects,
so both runs decode the same number of tokens), rounds interleaved. Prints the median wall time per decoding
step (one token for every row) of each, their ratio (issue 42's target: at most 1.3), and the time the masks of
a step took (`sequence.allowed_tokens`, all the constrained rows of the step), which depends less on the load.

`--keras`: instead, Keras's `lm.generate_constrained(json_schema=...)` (a host-stepped loop of eager cached
steps) against `lm.generate` (the compiled loop), batch 1, gpt_stdlib (trained; 128 positions) on the current backend.
"""

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import threading
import time

import keras_transformer as kt

SCHEMA = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array",
            "minItems": 50,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "id": {"type": "integer", "minimum": 0},
                    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
                },
                "required": ["name", "id", "tags"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["rows"],
    "additionalProperties": False,
}
PROMPTS = ["Write the rows as JSON: ", "rows = ", "The answer is ", "{", "Data:", "List them: ", "JSON", "Here:"]


def export(directory):
    return kt.models.CausalLM.from_preset("smollm2_135m").export(os.path.join(directory, "smollm2"), format="onnx")


def bundle_modules(bundle):
    """The bundle's own runtime modules (they import each other by file name, from the bundle's directory)."""
    sys.path.insert(0, str(bundle))
    names = ("batching", "constraint", "generator", "decode_loop", "sequence")
    return {name: importlib.import_module(name) for name in names}


class MaskTimer:
    """Wraps `sequence.allowed_tokens` (the mask of every constrained row of a step): its time per call."""

    def __init__(self, sequence_module):
        self.module, self.inner, self.seconds, self.calls = sequence_module, sequence_module.allowed_tokens, 0.0, 0
        sequence_module.allowed_tokens = self

    def __call__(self, matchers, vocabulary_size):
        started = time.perf_counter()
        try:
            return self.inner(matchers, vocabulary_size)
        finally:
            self.seconds, self.calls = self.seconds + time.perf_counter() - started, self.calls + 1

    def take(self):
        """-> ms per call since the last take."""
        per_call = self.seconds / max(self.calls, 1) * 1e3
        self.seconds, self.calls = 0.0, 0
        return per_call


def run(runtime, scheduler, grammars, grammar, prompts, tokens):
    """k sequences submitted together -> (wall seconds, decode steps, tokens generated)."""
    done, finished = threading.Event(), []

    def on_event(kind, value):
        if kind in ("finish", "error"):
            finished.append(value)
            if len(finished) == len(prompts):
                done.set()

    steps = scheduler.steps
    started = time.perf_counter()
    sequences = [
        runtime["batching"].Sequence(
            ids, tokens, on_event, constraint=None if grammar is None else grammars.matcher(grammar)
        )
        for ids in prompts
    ]
    for sequence in sequences:
        scheduler.submit(sequence)
    done.wait(600)
    seconds = time.perf_counter() - started
    assert finished == ["length"] * len(prompts), finished  # every sequence decoded all its tokens
    return seconds, scheduler.steps - steps, sum(len(s.generated) for s in sequences)


def keras_cost(tokens, rounds):
    """Keras: time per token of the constrained host loop against the compiled loop (batch 1, gpt_stdlib)."""
    lm = kt.models.GPTCausalLM.from_preset("gpt_stdlib")
    prompt = lm.preprocessor.generate_preprocess(["rows = "])
    lm.generate(prompt, max_new_tokens=tokens, stop_token_ids=None)  # compile
    lm.generate_constrained(prompt, max_new_tokens=4, json_schema=SCHEMA)  # warm up
    times = {"compiled": [], "json_schema": []}
    for _ in range(rounds):
        started = time.perf_counter()
        lm.generate(prompt, max_new_tokens=tokens, stop_token_ids=None)
        times["compiled"].append((time.perf_counter() - started) / tokens)
        started = time.perf_counter()
        rows = lm.generate_constrained(prompt, max_new_tokens=tokens, json_schema=SCHEMA)
        assert len(rows[0]) == len(prompt[0]) + tokens  # no early end: the same number of tokens
        times["json_schema"].append((time.perf_counter() - started) / tokens)
    compiled, constrained = (statistics.median(times[name]) * 1e3 for name in ("compiled", "json_schema"))
    backend = os.environ.get("KERAS_BACKEND", "default")
    print(
        f"Keras ({backend}), gpt_stdlib, batch 1, {tokens} tokens: compiled loop {compiled:.2f} ms/token, "
        f"json_schema host loop {constrained:.2f} ms/token, ratio {constrained / compiled:.2f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", help="an LM bundle (default: export smollm2_135m with random weights)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keras", action="store_true", help="Keras's constrained generate instead")
    args = parser.parse_args()
    if args.keras:
        return keras_cost(args.tokens, args.rounds)
    with tempfile.TemporaryDirectory() as directory:
        bundle = args.bundle or export(directory)
        runtime = bundle_modules(bundle)
        generator = runtime["generator"].Generator(bundle)
        stop = runtime["decode_loop"].auto_stop_tokens(generator.config)
        grammars = runtime["constraint"].Grammars(
            os.path.join(bundle, "tokenizer.json"), generator.bundle["vocabulary_size"], stop
        )
        grammar = grammars.compile("json", SCHEMA)
        scheduler = runtime["batching"].Scheduler(generator, max_rows=8).start()
        masks = MaskTimer(runtime["sequence"])
        print(f"bundle {bundle}: vocabulary {generator.bundle['vocabulary_size']}, {args.tokens} new tokens")
        load = os.getloadavg()[0]
        for k in (1, 8):
            prompts = [generator.encode(PROMPTS[i % len(PROMPTS)]) for i in range(k)]
            run(runtime, scheduler, grammars, grammar, prompts, 4)  # warm up
            masks.take()
            times = {"unconstrained": [], "json_schema": []}
            for _ in range(args.rounds):
                for name, chosen in (("unconstrained", None), ("json_schema", grammar)):
                    seconds, steps, _ = run(runtime, scheduler, grammars, chosen, prompts, args.tokens)
                    times[name].append(seconds / args.tokens)  # the first token is the prefill's
            free, constrained = (statistics.median(times[name]) * 1e3 for name in ("unconstrained", "json_schema"))
            print(
                f"batch {k}: unconstrained {free:.2f} ms/token, json_schema {constrained:.2f} ms/token, "
                f"ratio {constrained / free:.2f}; the masks of a step {masks.take():.2f} ms"
            )
        scheduler.stop(60)
        print(f"load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
