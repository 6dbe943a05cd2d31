"""The bundle server's prefix cache (issue 42): time to first token and throughput with and without it.

    python benchmarks/prefix_cache.py [--bundle DIR] [--system 512] [--question 16] [--clients 32]
                                      [--max-tokens 16] [--rounds 3]

Exports `smollm2_135m` (the SmolLM2-135M shape, its real tokenizer, random weights; 30 layers) to an ONNX bundle
unless --bundle is given, then runs the bundle's own `batching.Scheduler` in this process (what `serve.py` runs,
without HTTP). Prompts are chat-like token ids: the start token, a shared system prompt of --system tokens, then
a question of --question tokens (taken from the tokenized text of this file, so real tokens).
1. Time to first token, one request at a time: a cold request (a system prompt never seen: nothing cached),
   then a repeated-prefix one (the same system prompt, another question: its 512 positions read from the
   cache); --rounds of each, medians, and their ratio (issue 42's target: at most 0.3).
2. Throughput: --clients requests sharing the system prompt, submitted together, --max-tokens greedy tokens
   each; generated tokens per second with the cache off, and on (the system prompt cached by an earlier
   request, as on a server that has seen it; and from an empty cache, where the first prefill of the burst
   stores the prefix for the others), and the ratio (issue 42's target: at least 1.5).
"""

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import threading
import time


def export(directory):
    import keras_transformer as kt

    return kt.models.CausalLM.from_preset("smollm2_135m").export(os.path.join(directory, "smollm2"), format="onnx")


class Run:
    """Sequences submitted to one scheduler: when each was submitted, gave its first token and finished."""

    def __init__(self, batching, scheduler, prompts, max_tokens):
        self.done = threading.Semaphore(0)
        self.first, self.sequences = {}, []
        for i, ids in enumerate(prompts):
            self.sequences.append(batching.Sequence(ids, max_tokens, lambda kind, value, i=i: self._event(i, kind)))
        self.started = time.perf_counter()
        for sequence in self.sequences:
            scheduler.submit(sequence)
        for _ in self.sequences:
            self.done.acquire()
        self.seconds = time.perf_counter() - self.started

    def _event(self, i, kind):
        if kind == "token":
            self.first.setdefault(i, time.perf_counter())
        elif kind in ("finish", "error"):
            self.done.release()

    def ttft(self):
        return self.first[0] - self.started

    def tokens(self):
        return sum(len(sequence.generated) for sequence in self.sequences)


def prompts(tokenizer, bos, system_length, question_length, count, variant=0):
    """`count` prompts: the start token, a system prompt (`variant` changes its first token), a question each."""
    text = open(__file__).read()
    ids = tokenizer.encode(text * (1 + (system_length + count * question_length) // 1000)).ids
    system = ids[:system_length]
    system[0] = (system[0] + 1 + variant) % tokenizer.get_vocab_size()
    questions = [ids[system_length + i * question_length :][:question_length] for i in range(count)]
    return [[bos] + system + question for question in questions]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--system", type=int, default=512)
    parser.add_argument("--question", type=int, default=16)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bundle = args.bundle or export(tempfile.mkdtemp())
    sys.path.insert(0, str(bundle))
    batching, generate = importlib.import_module("batching"), importlib.import_module("generate")
    generator = generate.Generator(bundle)
    bos = generator.config["bos_token_id"]

    def scheduler(cache_tokens):
        return batching.Scheduler(generator, max_rows=args.clients, prefix_cache_tokens=cache_tokens).start()

    cached = scheduler(batching.PREFIX_CACHE_TOKENS)
    cold, warm = [], []
    for r in range(args.rounds + 1):  # round 0 warms ONNX Runtime up
        two = prompts(generator.tokenizer, bos, args.system, args.question, 2, variant=100 + r)
        cold_run = Run(batching, cached, two[:1], 1)
        warm_run = Run(batching, cached, two[1:], 1)
        assert warm_run.sequences[0].cached_tokens == args.system // 16 * 16, warm_run.sequences[0].cached_tokens
        if r:
            cold.append(cold_run.ttft())
            warm.append(warm_run.ttft())
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    print(f"prompt: 1 + {args.system} + {args.question} tokens; {args.rounds} rounds, medians")
    print(f"TTFT cold {cold_s * 1000:.0f} ms, repeated prefix {warm_s * 1000:.0f} ms: ratio {warm_s / cold_s:.3f}")

    *burst, seen = prompts(generator.tokenizer, bos, args.system, args.question, args.clients + 1)
    results = {}
    plain = scheduler(0)
    results["off"] = Run(batching, plain, burst, args.max_tokens)
    plain.stop()
    results["on, empty cache"] = Run(batching, scheduler(batching.PREFIX_CACHE_TOKENS), burst, args.max_tokens)
    Run(batching, cached, [seen], 1)  # another question after the same system prompt
    results["on, prefix seen"] = Run(batching, cached, burst, args.max_tokens)
    cached.stop()
    reference = [sequence.generated for sequence in results["off"].sequences]
    for name, run in results.items():
        assert [sequence.generated for sequence in run.sequences] == reference, f"{name}: other tokens"
        rate = run.tokens() / run.seconds
        print(
            f"{args.clients} concurrent, {args.max_tokens} tokens each, cache {name}: {run.seconds:.1f} s, "
            f"{rate:.1f} tokens/s, x{rate / (results['off'].tokens() / results['off'].seconds):.2f}; "
            f"{sum(sequence.cached_tokens for sequence in run.sequences)} prompt tokens read from the cache"
        )


if __name__ == "__main__":
    main()
