"""Multi-worker mirrored training of the digits models, fault tolerant and elastic.

Run it as a local cluster (each worker gets its TF_CONFIG from the launcher):

    tensorfleet launch --workers 2 --max-restarts 2 examples/train_digits_multiworker.py -- --epochs 6

It trains deterministically (op determinism, fixed seeds, the same batches in an epoch
whenever the epoch starts), so a run that was killed and resumed from its backup ends with
the weights of one that was not. The batch sizes follow the elastic policy
(``--batch-policy`` or ``TENSORFLEET_BATCH_POLICY``) for whatever number of workers the job
has; ``tensorfleet launch --scale-lr linear:64`` scales the learning rate with the global batch at each
start. The chief writes the final weights to ``--weights-out`` (``.npz``).
"""

from __future__ import annotations

import argparse
import io
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits_cnn", choices=["digits_cnn", "digits_mlp"])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--examples-per-epoch", type=int, default=512)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--per-replica-batch-size", type=int, default=32)
    parser.add_argument("--batch-policy", default=None, help="keep_global or keep_per_replica")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backup-dir", default=None, help="default: $TENSORFLEET_BACKUP_DIR")
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--best-model", default=None, help="path of the best model (.keras)")
    parser.add_argument("--collective-timeout", type=float, default=30.0,
                        help="seconds before a collective with a missing peer fails instead of hanging")
    parser.add_argument("--weights-out", default=None)
    parser.add_argument("--log-steps", action="store_true")
    parser.add_argument("--local-sgd", type=int, default=0, metavar="H",
                        help="local SGD: replicas average their weights every H steps (0: synchronous)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import numpy as np
    import tensorflow as tf

    from tensorfleet import strategies
    from tensorfleet.cluster import BatchPolicy, batch_sizes, callbacks as fault_tolerant_callbacks, policy_from_env
    from tensorfleet.io import write_bytes
    from tensorfleet.models import build, load_digits

    keras = tf.keras  # this process's Keras: Keras 3, or tf_keras where TF_USE_LEGACY_KERAS=1 was set
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()

    strategy = strategies.build("multi_worker_mirrored", implementation="ring",
                                timeout_seconds=args.collective_timeout)
    replicas = strategy.num_replicas_in_sync
    policy = BatchPolicy(args.batch_policy) if args.batch_policy else policy_from_env()
    sizes = batch_sizes(replicas, policy=policy, global_batch_size=args.global_batch_size,
                        per_replica_batch_size=args.per_replica_batch_size)
    print(f"tensorfleet: replicas={replicas} policy={policy.value} global_batch={sizes.global_batch_size} "
          f"per_replica_batch={sizes.per_replica_batch_size}", flush=True)

    split = load_digits(seed=args.seed, flat=args.model == "digits_mlp")
    n = min(args.examples_per_epoch, len(split.x_train))
    n -= n % sizes.global_batch_size
    # Not shuffled per epoch and not repeated: every epoch sees the same batches in the same
    # order no matter when it starts, which a resumed run needs to match an uninterrupted one.
    dataset = tf.data.Dataset.from_tensor_slices((split.x_train[:n], split.y_train[:n])).batch(
        sizes.global_batch_size, drop_remainder=True)
    val = tf.data.Dataset.from_tensor_slices((split.x_test, split.y_test)).batch(sizes.global_batch_size)

    with strategy.scope():
        model = build(args.model, seed=args.seed)  # in this process's Keras too
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    callbacks = fault_tolerant_callbacks(args.backup_dir, save_freq=save_freq, best_model=args.best_model,
                                         monitor="val_accuracy", mode="max", log_steps=args.log_steps, keras=model,
                                         global_batch_size=sizes.global_batch_size)  # for launch --scale-lr
    if args.local_sgd:  # first, so each epoch's backup holds the averaged weights
        callbacks.insert(0, strategies.LocalSGD(every=args.local_sgd, keras=model))
    model.fit(dataset, epochs=args.epochs, validation_data=val, callbacks=callbacks, verbose=0)

    weights = model.get_weights()
    total = float(sum(np.abs(w).sum() for w in weights))
    print(f"tensorfleet: done iterations={int(model.optimizer.iterations.numpy())} sum_abs_weights={total:.6f}",
          flush=True)
    if args.weights_out and strategy.extended.should_checkpoint:
        buffer = io.BytesIO()
        np.savez(buffer, *weights)
        write_bytes(args.weights_out, buffer.getvalue())


if __name__ == "__main__":
    main()
