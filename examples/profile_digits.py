"""Where the step time goes: the digits CNN profiled alone or as any launched job.

Alone, one process (``--input-delay-ms`` slows the input pipeline, so the verdict has something
to find); the script records the steps and prints the report:

    python examples/profile_digits.py --profile-steps 10-20 --input-delay-ms 20 --profile-dir profile

As a job: the launcher records the chosen steps on every task (a parameter-server job's workers
and ps task included), one folder each; read them afterwards:

    tensorfleet launch --workers 2 --ps 1 --profile-steps 10-20 examples/profile_digits.py
    tensorfleet profile report profile/

The strategy is ``auto`` (parameter server, multi-worker or local, from the environment), and the
inputs come from ``fit_inputs``, which suits each.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--profile-steps", default=None, help="Steps to record when run alone (FIRST-LAST).")
    parser.add_argument("--profile-dir", default="profile", help="Where a run alone records.")
    parser.add_argument("--input-delay-ms", type=float, default=0.0, help="Sleep per batch in the input "
                        "pipeline (run alone only).")
    return parser.parse_args(argv)


def slowed(dataset, delay_ms: float):
    """``dataset`` with a Python sleep of ``delay_ms`` per batch, as a slow disk or decoder would add."""
    import tensorflow as tf

    def pause(x, y):
        time.sleep(delay_ms / 1000)
        return x, y

    def map_fn(x, y):
        x2, y2 = tf.py_function(pause, [x, y], [x.dtype, y.dtype])
        return tf.ensure_shape(x2, x.shape), tf.ensure_shape(y2, y.shape)

    return dataset.map(map_fn)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.models import load_digits

    alone = not os.environ.get("TF_CONFIG")
    strategy = tfl.strategies.build("auto", announce=False)
    split = load_digits(seed=0)
    with strategy.scope():
        model = tfl.models.build("digits_cnn", seed=0)
        model.compile(tf.keras.optimizers.Adam(0.01), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if alone and args.input_delay_ms:
        data = tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train)).shuffle(2048, seed=0)
        inputs = {"x": slowed(data.batch(args.batch_size), args.input_delay_ms).repeat(),
                  "steps_per_epoch": args.steps_per_epoch}
    else:
        inputs = tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=args.batch_size, strategy=model,
                                           steps_per_epoch=args.steps_per_epoch)
    # Launched with --profile-steps, the environment names the steps (and the launcher's runner adds
    # the same callback when the script has none); alone, the command line does.
    callbacks = tfl.profiling.callbacks()
    if not callbacks and alone and args.profile_steps:
        callbacks = [tfl.profiling.ProfileCallback(args.profile_dir, steps=args.profile_steps)]
    model.fit(**inputs, epochs=args.epochs, callbacks=callbacks, verbose=0)
    if alone and callbacks:
        profile = tfl.profiling.analyze(args.profile_dir)
        print(tfl.profiling.format_table(profile))
        paths = tfl.profiling.write_report(profile)
        print(f"wrote {paths['json']}, {paths['png']} and {paths['trace']}")


if __name__ == "__main__":
    main()
