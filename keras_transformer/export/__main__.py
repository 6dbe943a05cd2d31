"""`python -m keras_transformer.export PRESET OUT_DIR --format onnx|tf_saved_model [--overwrite]`.

Run by hand it is the same as `keras-transformer export`. It is also the process the
exporter starts under the TensorFlow backend when the caller's backend is JAX or PyTorch:
then `--write-into DIR FORMAT` (repeated) writes into the caller's temporary directories,
which the caller renames, and `--weights DIR` holds the weights the caller handed over
(export/handover.py) for a preset saved without them.
"""

import argparse
import sys

from keras_transformer import export
from keras_transformer.export import handover


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_transformer.export", description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a registered preset name or a preset directory")
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--format", default="onnx", choices=("onnx", "tf_saved_model"))
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--write-into", nargs=2, action="append", metavar=("DIR", "FORMAT"), help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)  # the parent's weights (export/handover.py)
    args = parser.parse_args(argv)
    if (args.out_dir is None) == (args.write_into is None):
        parser.error("pass OUT_DIR")

    if args.weights is not None:

        def build():
            return export.load_preset_task(args.preset, load_weights=False)

        task = handover.build_with_weights(build, args.weights)
    else:
        task = export.load_preset_task(args.preset)
    if args.write_into:
        for directory, format in args.write_into:
            export.write(task, directory, format)
    else:
        export.export_model(task, args.out_dir, format=args.format, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
