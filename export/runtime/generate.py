"""Run an exported keras_transformer bundle with numpy, onnxruntime and tokenizers only.

Every ONNX bundle carries a copy of this file and of the modules it imports. From the command line:

    python BUNDLE/generate.py --prompt "def add(" --sampler greedy --max-new-tokens 32
    python BUNDLE/generate.py --prompt "def add(" --sampler beam --num-beams 4
    python BUNDLE/generate.py --prompt "def add(" --sampler random --temperature 0.8 --top-p 0.9 --seed 0
    python BUNDLE/generate.py --chat --prompt "What is 2 + 2?"     # a user message, through the chat template
    python BUNDLE/generate.py --prompt "def add(" --draft DRAFT_BUNDLE --num-draft-tokens 4   # speculative

From Python (with the bundle directory on `sys.path`, or this file imported by path):

    from generate import Generator
    Generator("BUNDLE").generate(["def add("], max_new_tokens=32, sampler="beam", num_beams=4)
    Generator("BUNDLE").generate([{"role": "user", "content": "Hi!"}])  # a bundle with a chat template

The runtime, one job per file (all next to this one in a bundle):
    generate.py       this command line, and the names above
    generator.py      `Generator`: prompts, chat messages or ids in, text or ids out, over the ONNX graphs
    decode_loop.py    the decoding loop (greedy, random, beam search), step for step that of
                      `keras_transformer.decoding`: the same model gives the same tokens
    sampling.py       choosing a token (temperature, top-k, top-p) and the noise of random sampling
    encoder.py        `Encoder`: encoder bundles (BERT tasks)
    bundle_files.py   reading the bundle: JSON files, ONNX Runtime sessions, tokenizer, chat template
    chat_template.py  chat rendering and message checks: a copy of keras_transformer/tokenizers/chat_template.py
    batching.py, sequence.py, cache_rows.py  continuous batching (the scheduler; a sequence; the caches' rows)
    prefix_cache.py   the server's store of prompt prefixes' keys/values (blocks, LRU)
    prompt_lookup.py  speculative decoding: drafts by prompt lookup or from a draft bundle (exact)
    constraint.py     constrained decoding: grammars (llguidance) and their token masks
    serve.py, serve_endpoints.py, serve_streaming.py, serve_validation.py   the HTTP server, with
    serve_fields.py, serve_logprobs.py, serve_constraints.py, serve_tools.py   its fields, logprobs,
                      structured output and tool calls

Samplers:
    greedy: the most likely token.
    random: a draw from softmax(logits / temperature), restricted to the `top_k` most
        likely tokens, then to the smallest set whose probability reaches `top_p`.
    beam:   Hugging Face's beam search: `num_beams` running beams scored by summed
        log-probabilities, finished hypotheses scored `sum / length ** length_penalty`,
        stopping as `early_stopping` says; the best hypothesis is returned.
"""

import argparse
import json
import os
import sys

# The runtime's other modules sit next to this file; it may be imported by path (`keras-transformer generate`).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from bundle_files import read_json  # noqa: E402
from decode_loop import Interrupted  # noqa: E402
from encoder import Encoder  # noqa: E402
from generator import Generator  # noqa: E402
from sampling import SAMPLERS  # noqa: E402

__all__ = ["Encoder", "Generator", "Interrupted", "SAMPLERS", "main"]


def main(argv=None):
    parser = argparse.ArgumentParser(description="Generate text with this keras_transformer bundle.")
    parser.add_argument("--bundle", default=_HERE, help="bundle directory")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    parser.add_argument("--sampler", default="greedy", choices=SAMPLERS)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--chat",
        action="store_true",
        help="each prompt is a user message, rendered by the bundle's chat template; prints the reply",
    )
    parser.add_argument("--draft", default=None, help="a draft bundle of the same vocabulary: speculative decoding")
    parser.add_argument("--num-draft-tokens", type=int, default=None, help="the draft's tokens per step (default 5)")
    args = parser.parse_args(argv)
    if read_json(os.path.join(args.bundle, "bundle.json"))["kind"] == "encoder":
        outputs = Encoder(args.bundle)(args.prompt)
        print(json.dumps({"logits": outputs["logits"].tolist()}))
        return 0
    generator = Generator(args.bundle)
    prompts = [[{"role": "user", "content": prompt}] for prompt in args.prompt] if args.chat else args.prompt
    texts = generator.generate(
        prompts,
        max_new_tokens=args.max_new_tokens,
        sampler=args.sampler,
        num_beams=args.num_beams,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        draft=args.draft,
        num_draft_tokens=args.num_draft_tokens,
    )
    for text in texts:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
