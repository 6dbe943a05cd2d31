"""`python -m keras_transformer.export PRESET OUT_DIR --format onnx|tf_saved_model`.

The process the exporter starts under the TensorFlow backend when the caller's backend is
JAX or PyTorch (with `--into-existing`: write into the caller's temporary directory, which
the caller renames). Run by hand it is the same as `keras-transformer export`.
"""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_transformer.export", description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a registered preset name or a preset directory")
    parser.add_argument("out_dir")
    parser.add_argument("--format", default="onnx", choices=("onnx", "tf_saved_model"))
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--into-existing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from keras_transformer import export

    task = export.load_preset_task(args.preset)
    if args.into_existing:
        export.write(task, args.out_dir, args.format)
    else:
        export.export_model(task, args.out_dir, format=args.format, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
