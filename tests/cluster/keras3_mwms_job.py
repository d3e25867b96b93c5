"""A Keras 3 user's multi-worker script, run by test_keras3_multi_worker.py through ``tensorfleet launch``.

Written as a user writes it: ``import keras`` and nothing else about Keras. A small MLP on the digits,
deterministic (fixed seeds, op determinism, the same batches in an epoch whenever it starts: ``fit_inputs``
shuffles each epoch by the seed and the optimizer's step count), trained with ``fit`` under
``tfl.strategies.build("multi_worker_mirrored")``, then ``evaluate`` and ``predict``. Every task
writes its results to ``OUT/<task>.json`` (``OUT/one-process.json`` with ``--one-process``, which trains the
same global batches in one process without a strategy).

Options: ``--epochs N``; ``--fault-tolerant`` adds ``tfl.cluster.fault_tolerance.callbacks(keras=model,
log_steps=True)`` on the backup directory the launcher passes (``TENSORFLEET_BACKUP_DIR``); ``--checkpoints DIR``
adds Keras 3's own ``keras.callbacks.ModelCheckpoint("DIR/epoch-{epoch}.keras")`` and tensorfleet's
``checkpoint_callback("DIR/tf")``; ``--resume FILE`` (with ``--one-process``) loads the model a ``ModelCheckpoint``
saved after epoch E (``epoch-E.keras``: its optimizer too) and trains the epochs after E.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 64
EXAMPLES = 512


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--one-process", action="store_true")
    parser.add_argument("--fault-tolerant", action="store_true")
    parser.add_argument("--checkpoints")
    parser.add_argument("--resume")
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.io import write_json

    # The strategy first: a multi-worker strategy must be built before TensorFlow's runtime starts.
    strategy = None if args.one_process else tfl.strategies.build("multi_worker_mirrored", implementation="ring",
                                                                  timeout_seconds=60)
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    split = tfl.models.datasets.load_digits(flat=True)
    test = tf.data.Dataset.from_tensor_slices((split.x_test, split.y_test)).batch(GLOBAL_BATCH)
    initial_epoch = 0
    with strategy.scope() if strategy else contextlib.nullcontext():
        if args.resume:
            model = keras.models.load_model(args.resume)
            initial_epoch = int(os.path.basename(args.resume).removeprefix("epoch-").removesuffix(".keras"))
        else:
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(10)])
            model.compile(optimizer=keras.optimizers.Adam(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = tfl.cluster.fault_tolerance.callbacks(keras=model, log_steps=True) if args.fault_tolerant else []
    saved: list[str] = []  # where model.save wrote (ModelCheckpoint's saves), for the test
    if args.checkpoints:
        save = model.save

        def recorded_save(filepath: str, *rest: object, **options: object) -> None:
            saved.append(str(filepath))
            save(filepath, *rest, **options)

        object.__setattr__(model, "save", recorded_save)
        callbacks += [keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoints, "epoch-{epoch}.keras")),
                      tfl.cluster.evaluation.checkpoint_callback(os.path.join(args.checkpoints, "tf"), keras=model)]
    train = tfl.strategies.fit_inputs(split.x_train[:EXAMPLES], split.y_train[:EXAMPLES], batch_size=GLOBAL_BATCH,
                                      strategy=model, seed=1)
    history = model.fit(**train, epochs=args.epochs, initial_epoch=initial_epoch, validation_data=test,
                        callbacks=callbacks, verbose=0)
    evaluation = model.evaluate(test, verbose=0, return_dict=True)
    predictions = model.predict(split.x_test, batch_size=GLOBAL_BATCH, verbose=0)

    task = json.loads(os.environ["TF_CONFIG"])["task"] if strategy else {"type": "one-process", "index": 0}
    result = {
        "task": task,
        "replicas": strategy.num_replicas_in_sync if strategy else 1,
        "history": {name: [float(v) for v in values] for name, values in history.history.items()},
        "evaluate": {name: float(value) for name, value in evaluation.items()},
        "predict_accuracy": float(np.mean(np.argmax(predictions, axis=1) == split.y_test)),
        "predict_rows": int(predictions.shape[0]),
        "weights": [w.ravel().tolist() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "saved": saved,
    }
    name = "one-process" if not strategy else f"{task['type']}{task['index']}"
    write_json(os.path.join(args.out, f"{name}.json"), result)
    print(f"tensorfleet: done {name} evaluate={result['evaluate']}", flush=True)


if __name__ == "__main__":
    main()
