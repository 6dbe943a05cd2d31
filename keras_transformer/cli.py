"""The `keras-transformer` command line.

    keras-transformer presets
    keras-transformer export PRESET_OR_DIR OUT_DIR --format onnx|tf_saved_model|huggingface|gguf
        [--overwrite] [--quantize int8|int4] [--gguf-type f32|f16|bf16|q8_0|q4_0]
    keras-transformer generate BUNDLE_OR_PRESET --prompt "..." [--sampler greedy|random|beam]
    keras-transformer convert HF_DIR_OR_GGUF OUT_PRESET_DIR [--allow-pickle] [--overwrite]
    keras-transformer serve BUNDLE [--host 127.0.0.1] [--port 8000] [serve.py's options]

Wherever a preset is taken, so is a GGUF file and a Hugging Face Hub handle: hf://org/name[@revision] or
hf://org/name/file.gguf[@revision] (see hub.py).

Keras (and the backend) loads only for the commands that need it, without TensorFlow's and XLA's
startup log lines; KERAS_TRANSFORMER_VERBOSE=1 shows them (see startup.py).

Each subcommand is one function decorated with `@command(name, help)`: it receives the
subparser to add its arguments to and returns the function that runs it. Adding a
subcommand (e.g. `convert`) is one more such function.
"""

import argparse
import os
import sys
from pathlib import Path

from keras_transformer.bundle_runtime import load_bundle_runtime
from keras_transformer.startup import import_keras_quietly

SAMPLERS = ("greedy", "random", "beam")
_COMMANDS = {}  # name -> (help, setup(parser) -> run(args))


def command(name, help):
    """Register `setup(parser)` as the subcommand `name`; `setup` returns the function that runs it."""

    def register(setup):
        _COMMANDS[name] = (help, setup)
        return setup

    return register


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-transformer", description="A Keras 3 Transformer model zoo.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help, setup) in _COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help, description=help)
        subparser.set_defaults(run=setup(subparser))
    return parser


def main(argv=None):
    """Entry point of the `keras-transformer` script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (ValueError, ImportError, RuntimeError) as error:
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 2


# --- presets ----------------------------------------------------------------


@command("presets", help="List the registered presets.")
def _presets(parser):
    def run(args):
        import_keras_quietly()
        from keras_transformer.presets import list_presets

        rows = list_presets()
        header = ("name", "family", "parameters", "weights", "description")
        table = [header] + [
            (
                r["name"],
                str(r["family"]),
                f"{r['parameter_count'] or 0:,}",
                "trained" if r["trained"] else "random",
                r["description"],
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
        for row in table:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])

    return run


# --- export -----------------------------------------------------------------


@command(
    "export", help="Export a preset to an ONNX bundle, a TensorFlow SavedModel, a Hugging Face folder or a GGUF file."
)
def _export(parser):
    parser.add_argument(
        "preset",
        metavar="PRESET_OR_DIR",
        help="a registered preset name, a preset directory or hf://org/name[@revision]",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--format", default="onnx", choices=("onnx", "tf_saved_model", "huggingface", "gguf"))
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument(
        "--quantize", choices=("int8", "int4"), default=None, help="ONNX only: the graphs' weights in 8 or 4 bits"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="huggingface only: the weights' dtype (default: the model's)",
    )
    parser.add_argument(
        "--max-shard-size",
        default=None,
        help="huggingface only: split the weights into shards of at most this size, e.g. 5GB",
    )

    parser.add_argument(
        "--gguf-type",
        choices=("f32", "f16", "bf16", "q8_0", "q4_0"),
        default=None,
        help="gguf only: the weights' type, as llama.cpp's converter names them (default f16)",
    )

    def run(args):
        import_keras_quietly()
        from keras_transformer import export

        options = {}
        if args.gguf_type is not None and args.format != "gguf":
            raise ValueError(f"--gguf-type applies to --format gguf. Received: --format {args.format}")
        if args.format == "gguf":
            return _export_gguf(args, export)
        if args.format == "huggingface":
            size = args.max_shard_size or "5GB"
            options = {"dtype": args.dtype, "max_shard_size": int(size) if size.isdigit() else size}  # bytes or "5GB"
        elif args.dtype or args.max_shard_size:
            raise ValueError(
                f"--dtype and --max-shard-size apply to --format huggingface. Received: --format {args.format}"
            )
        task = export.load_preset_task(args.preset)
        path = export.export_model(
            task, args.out_dir, format=args.format, overwrite=args.overwrite, quantize=args.quantize, **options
        )
        quantized = f", {args.quantize} weights" if args.quantize else ""
        print(f"Exported {type(task).__name__} to {path} ({args.format}{quantized}).")

    return run


def _export_gguf(args, export):
    if args.quantize or args.dtype or args.max_shard_size:
        raise ValueError("--quantize, --dtype and --max-shard-size do not apply to --format gguf: use --gguf-type.")
    task = export.load_preset_task(args.preset)
    path = task.export(args.out_dir, format="gguf", overwrite=args.overwrite, gguf_type=args.gguf_type or "f16")
    print(f"Exported {type(task).__name__} to {path} (gguf, {args.gguf_type or 'f16'}).")


# --- generate ---------------------------------------------------------------


@command("generate", help="Generate text with an ONNX bundle (no Keras needed) or a preset.")
def _generate(parser):
    parser.add_argument(
        "model",
        metavar="BUNDLE_OR_PRESET",
        help="an exported ONNX bundle, a preset name or directory, or hf://org/name[@revision]",
    )
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    parser.add_argument("--sampler", default="greedy", choices=SAMPLERS)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)

    def run(args):
        options = dict(
            max_new_tokens=args.max_new_tokens,
            sampler=args.sampler,
            num_beams=args.num_beams,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
        )
        if (Path(args.model) / "bundle.json").is_file():
            texts = load_bundle_runtime(args.model).Generator(args.model).generate(args.prompt, **options)
        else:
            texts = _generate_with_keras(args.model, args.prompt, options)
        for text in texts:
            print(text)

    return run


# --- serve ------------------------------------------------------------------


@command("serve", help="Serve an ONNX bundle over HTTP (OpenAI-compatible; runs the bundle's serve.py, no Keras).")
def _serve(parser):
    parser.add_argument("bundle", metavar="BUNDLE", help="an exported ONNX bundle directory")
    parser.add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="serve.py's options: --host, --port, --max-batch, --max-queue, --timeout, ...",
    )

    def run(args):
        path = Path(args.bundle) / "serve.py"
        if not path.is_file():
            raise ValueError(
                f"{args.bundle} has no serve.py: not an ONNX bundle (or one exported before serving "
                "existed: export it again)."
            )
        # The bundle's own server replaces this process: it imports no Keras, and signals reach it directly.
        os.execv(sys.executable, [sys.executable, str(path), "--bundle", str(args.bundle), *args.options])

    return run


def _generate_with_keras(preset, prompts, options):
    import_keras_quietly()
    from keras_transformer.export import load_preset_task

    task = load_preset_task(preset)
    if not hasattr(task, "generate"):
        raise ValueError(f"The preset {preset!r} holds a {type(task).__name__}, which does not generate text.")
    from keras_transformer.samplers import BeamSampler, GreedySampler, RandomSampler

    if options["sampler"] == "beam":
        sampler = BeamSampler(num_beams=options["num_beams"])
    elif options["sampler"] == "random":
        sampler = RandomSampler(
            temperature=options["temperature"], top_k=options["top_k"], top_p=options["top_p"], seed=options["seed"]
        )
    else:
        sampler = GreedySampler()
    return task.generate(prompts, max_new_tokens=options["max_new_tokens"], sampler=sampler)


# --- convert ----------------------------------------------------------------


@command(
    "convert",
    help="Convert a Hugging Face checkpoint (a directory or hf://org/name[@revision]) or a GGUF file "
    "(model.gguf or hf://org/name/file.gguf[@revision]) into a preset.",
)
def _convert(parser):
    parser.add_argument(
        "hf_dir",
        metavar="HF_DIR",
        help="a directory with config.json, model.safetensors and tokenizer.json, hf://org/name[@revision], "
        "a .gguf file or hf://org/name/file.gguf[@revision]",
    )
    parser.add_argument("out_dir", metavar="OUT_PRESET_DIR")
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="read pytorch_model.bin when there is no safetensors file: pickle can run code, "
        "so only for sources you trust (read with torch.load(weights_only=True))",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_PRESET_DIR if it exists")

    def run(args):
        import_keras_quietly()
        from keras_transformer.convert import convert

        model = convert(args.hf_dir, args.out_dir, allow_pickle=args.allow_pickle, overwrite=args.overwrite)
        print(f"Converted {args.hf_dir} to a {type(model).__name__} preset in {args.out_dir}.")

    return run


if __name__ == "__main__":
    sys.exit(main())
