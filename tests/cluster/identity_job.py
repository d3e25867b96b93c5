"""Bit-identity of a continued job, run in a process of its own by test_migration.py.

Trains the migrating job under mirrored over 2 devices twice: once straight to step STOP, once to
step MID, saved, then restored into a new model and trained on to STOP. Prints one JSON line:
whether every saved tensor (weights, Adam's slots and step, example counts) is bit-identical.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MID, STOP = 3, 7


def main(job: str, root: str) -> None:
    import numpy as np

    import tensorfleet as tfl  # noqa: F401  (tf.keras is tf_keras)
    import tensorflow as tf

    from tensorfleet.cluster.jobstate import latest, tf_checkpoint_prefix
    from tensorfleet.cluster.resumable import TaskOptions, Trainer, _initial_state, load_job, train

    definition = load_job(job)

    def run(directory: str, stop: int, resume: bool) -> None:
        options = TaskOptions(directory=directory, strategy="mirrored", devices=2, epochs=1, global_batch_size=8,
                              stop_at_step=stop, resume=resume)
        trainer = Trainer(definition, options)
        train(trainer, _initial_state(trainer, options))

    straight, moved = os.path.join(root, "straight"), os.path.join(root, "moved")
    for directory in (straight, moved):
        os.makedirs(directory)
    run(straight, STOP, False)
    run(moved, MID, False)
    run(moved, STOP, True)
    readers = [tf.train.load_checkpoint(tf_checkpoint_prefix(latest(d))) for d in (straight, moved)]
    names = sorted(readers[0].get_variable_to_shape_map())
    equal = {name: bool(np.array_equal(readers[0].get_tensor(name), readers[1].get_tensor(name)))
             for name in names if not name.startswith("_")}
    print(json.dumps({"equal": equal, "iterations": int(readers[1].get_tensor(
        "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
