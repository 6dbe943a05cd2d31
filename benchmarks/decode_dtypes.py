"""Decoding time per token by the model's dtype, against float32 in the same run: float32, bfloat16, the
mixed_bfloat16 policy, int8 and int4 weights (`quantize()`), and PyTorch's compiled step against its eager one.

    KERAS_BACKEND=torch python benchmarks/decode_dtypes.py              # dtypes, eager steps (this CPU's default)
    KERAS_BACKEND=torch python benchmarks/decode_dtypes.py --compiled   # + the torch.compile'd step (inductor)
    KERAS_BACKEND=torch python benchmarks/decode_dtypes.py --int4-forms # int4 weights: unpacked once or per step

Models: the generate benchmark's GPT (4 layers, d 256, 4 heads, d_ff 1024, vocabulary 8000) and a Llama of
the same size (4 layers, d 256, 4 heads, 2 key/value heads, SwiGLU 768), random weights. Prompts of 16
random tokens, `--new` new tokens, no stop token, greedy and beam-4 at batch 1. Each case compiles in a
first call, then the cases alternate for `--repeats` rounds; ms per token is each one's best round and
the ratio is its time over float32's (below 1.5: the issue's CPU target for bfloat16).
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding import compile as compile_lib  # noqa: E402

MODELS = {
    "gpt": lambda dtype: kt.models.GPTCausalLM(
        kt.models.GPTBackbone(
            vocabulary_size=8000,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            max_sequence_length=512,
            dtype=dtype,
        )
    ),
    "llama": lambda dtype: kt.models.LlamaCausalLM(
        kt.models.LlamaBackbone(
            vocabulary_size=8000,
            num_layers=4,
            num_heads=4,
            num_key_value_heads=2,
            hidden_dim=256,
            intermediate_dim=768,
            max_sequence_length=512,
            dtype=dtype,
        )
    ),
}


def build(family, variant):
    keras.utils.set_random_seed(0)
    if variant in ("int8", "int4"):
        lm = MODELS[family]("float32")
        lm.quantize(variant)
        return lm
    return MODELS[family](variant)


def int4_forms(repeats, rows=1, steps=20):
    """ms for one step's projections of the Llama (every Dense / EinsumDense, one token, `rows` rows): float32
    weights; int4 weights unpacked and dequantized once and kept (the kernels' form); and unpacked and
    dequantized at every step (the packed weights' memory only, an extra pass over every weight a step); and
    the arranging of every projection's weights (what the kernels pay once, and again after a weight changes)."""
    import torch

    from keras_transformer.kernels.torch_weights import linear, projection, quantization

    def projections(variant):
        layers = [
            layer
            for layer in build("llama", variant)._flatten_layers()
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
        ]
        assert all(quantization(layer) == (None if variant == "float32" else variant) for layer in layers)
        widths = [(layer._kernel if variant == "int4" else layer.kernel).shape[0] for layer in layers]
        return list(zip(layers, widths))

    forms = {
        "float32": (projections("float32"), True),
        "int4, unpacked once (kept)": (projections("int4"), True),
        "int4, unpacked every step": (projections("int4"), False),
    }
    best = dict.fromkeys(forms, float("inf"))
    arrange = dict.fromkeys(("float32", "int4, unpacked once (kept)"), float("inf"))
    with torch.no_grad():
        for _ in range(repeats):
            for name in arrange:
                start = time.perf_counter()
                [projection(layer, width) for layer, width in forms[name][0]]
                arrange[name] = min(arrange[name], time.perf_counter() - start)
        cached = {name: [projection(layer, width) for layer, width in layers] for name, (layers, _) in forms.items()}
        inputs = {name: [torch.randn(rows, 1, width) for _, width in layers] for name, (layers, _) in forms.items()}
        for _ in range(repeats):
            for name, (layers, once) in forms.items():
                start = time.perf_counter()
                for _ in range(steps):
                    for (layer, width), x, arranged in zip(layers, inputs[name], cached[name]):
                        linear(x, *(arranged if once else projection(layer, width)))
                best[name] = min(best[name], (time.perf_counter() - start) / steps)
    print(f"one step's projections of the Llama, {rows} row(s): ms (ratio to float32)")
    for name in forms:
        print(f"| {name} | {1000 * best[name]:.3f} ({best[name] / best['float32']:.2f}) |")
    print("arranging every projection's weights (once, and after a weight changes): ms")
    for name in arrange:
        print(f"| {name} | {1000 * arrange[name]:.3f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compiled", action="store_true", help="also the torch.compile'd step (PyTorch)")
    parser.add_argument(
        "--variants",
        default="float32,bfloat16,mixed_bfloat16,int8,int4",
        help="comma-separated, float32 first (the ratios' reference)",
    )
    parser.add_argument("--families", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    parser.add_argument(
        "--int4-forms", action="store_true", help="(PyTorch) only: int4 projections unpacked once vs at every step"
    )
    args = parser.parse_args()
    if args.int4_forms:
        return int4_forms(args.repeats)
    variants = args.variants.split(",")
    if variants[0] != "float32":
        raise ValueError(f"--variants must start with float32 (the ratios' reference); got {args.variants!r}")
    families = args.families.split(",")
    unknown = sorted(set(families) - set(MODELS))
    if unknown:
        raise ValueError(f"--families: unknown {unknown}; known: {sorted(MODELS)}")
    modes = ["eager", "compiled"] if args.compiled and keras.config.backend() == "torch" else [None]
    prompt = [list(np.random.default_rng(0).integers(1, 8000, 16))]
    print(f"backend {keras.config.backend()}, {args.new} new tokens, batch 1; ms per token (ratio to float32)")
    print("| model | sampler | step | " + " | ".join(variants) + " |")
    print("|---|---|---|" + "---:|" * len(variants))
    for family in families:
        models = {variant: build(family, variant) for variant in variants}
        for sampler in ("greedy", "beam"):
            for mode in modes:
                if mode is not None:
                    os.environ[compile_lib.TORCH_COMPILE_ENV] = "1" if mode == "compiled" else "0"

                def run(lm):
                    lm.generate(prompt, max_new_tokens=args.new, sampler=sampler, stop_token_ids=None)

                for lm in models.values():
                    run(lm)  # compiles
                best = {variant: float("inf") for variant in variants}
                for _ in range(args.repeats):
                    for variant, lm in models.items():
                        start = time.perf_counter()
                        run(lm)
                        best[variant] = min(best[variant], time.perf_counter() - start)
                ms = {variant: 1000 * best[variant] / args.new for variant in variants}
                cells = [f"{ms[v]:.3f} ({ms[v] / ms['float32']:.2f})" for v in variants]
                label = "beam-4" if sampler == "beam" else "greedy"
                print(f"| {family} | {label} | {mode or 'default'} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
