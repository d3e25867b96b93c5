"""From a trained Keras model to C sources for a microcontroller, checked on TFLite Micro.

Trains the digits CNN for a few epochs, converts it to full int8, runs it on the TFLite Micro
interpreter (against the desktop TFLite interpreter: LiteRT, or tflite_runtime on the tff track;
accuracy against Keras; smallest arena),
prints the size report for a board, and writes the .tflite, the report (JSON and PNG) and
the C sources (model array, op resolver) to OUT_DIR.

Run: .venv/bin/python examples/export_microcontroller.py [OUT_DIR] [--target BOARD]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default="out/edge", type=Path)
    parser.add_argument("--target", default="arduino_nano_33_ble", help="a board name or 'flash=1M,ram=256K'")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)

    import keras

    import tensorfleet as tfl

    split = tfl.models.load_digits()
    model = tfl.models.build("digits_cnn", keras="keras3")
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(split.x_train, split.y_train, epochs=args.epochs, verbose=2)

    artifact = tfl.edge.convert(model, quantization="int8", representative_data=split.x_train)
    artifact.save(args.out_dir / "digits_int8.tflite")
    validation = tfl.edge.validate_micro(artifact, split.x_test, split.y_test)
    print(f"TFLite Micro: accuracy {validation.micro_accuracy:.4f} (Keras {validation.keras_accuracy:.4f}, "
          f"drop {validation.accuracy_drop_points:+.2f} points); smallest arena {validation.arena_bytes:,} bytes")
    print(validation.tflite_agreement())

    rep = tfl.edge.report(artifact, target=args.target, arena_bytes=validation.arena_bytes)
    print(rep.table())
    rep.save_json(args.out_dir / "digits_int8_report.json")
    rep.plot(args.out_dir / "digits_int8_report.png")
    for path in tfl.edge.export_c(artifact, args.out_dir / "c", name="digits", arena_bytes=validation.arena_bytes):
        print(f"wrote {path}")
    return 0 if rep.fit is None or rep.fit.fits else 1


if __name__ == "__main__":
    sys.exit(main())
