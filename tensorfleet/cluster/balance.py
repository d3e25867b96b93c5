"""Heterogeneous workers: per-replica batches proportional to each replica's measured speed.

After HetPipe (Park et al., USENIX ATC 2020) and the book's chapter on training in a
heterogeneous environment: in a synchronous step every replica waits for the slowest, so an
equal split of the global batch runs at the speed of the slowest worker. Giving each replica a
share of the step's examples proportional to its speed (examples per second, measured on every
step from the replica's own compute, before the all-reduce) lets all of them finish together.
The gradient stays the mean over the step's examples: each replica's loss is its examples' sum
divided by the step's number of examples, so the all-reduced sum is the same update whatever
the split (and equal to the uniform one in expectation over which examples land where).

Example:
    >>> proportional_split(16, [1.0, 0.5, 0.25])
    [8, 5, 3]
    >>> meter = SpeedMeter(3)
    >>> meter.update([100.0, 50.0, 25.0]); meter.update([80.0, 40.0, 20.0]); meter.speeds.tolist()
    [90.0, 45.0, 22.5]
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["SpeedMeter", "proportional_split", "ps_workers", "python_wait", "worker_wait"]


def proportional_split(examples: int, speeds: Sequence[float]) -> list[int]:
    """Splits ``examples`` over replicas in proportion to ``speeds`` (largest remainders), at least
    one each while there are as many examples as replicas, so every replica keeps being measured."""
    count = len(speeds)
    total = float(sum(speeds))
    if count == 0 or total <= 0:
        raise ValueError(f"speeds must be positive numbers, one per replica. Received: speeds={list(speeds)}")
    floor = 1 if examples >= count else 0
    spare = examples - floor * count
    exact = [spare * s / total for s in speeds]
    sizes = [int(e) for e in exact]
    order = sorted(range(count), key=lambda i: (exact[i] - sizes[i], -i), reverse=True)
    for i in order[:spare - sum(sizes)]:
        sizes[i] += 1
    return [floor + s for s in sizes]


class SpeedMeter:
    """An exponential moving average (weight ``decay`` on the past) of each replica's speed."""

    def __init__(self, replicas: int, *, decay: float = 0.5) -> None:
        import numpy as np

        self.speeds: Any = np.zeros(replicas)
        self.decay = decay
        self.measured = 0

    def update(self, speeds: Sequence[float]) -> None:
        import numpy as np

        current = np.asarray(speeds, dtype=float)
        self.speeds = current if self.measured == 0 else self.decay * self.speeds + (1 - self.decay) * current
        self.measured += 1

    @property
    def ready(self) -> bool:
        return self.measured > 0 and bool((self.speeds > 0).all())


def python_wait(seconds: Any) -> float:
    """Sleeps ``seconds`` in the replica's own Python (``tf.py_function``): a slowed input pipeline where a
    replica runs Python (mirrored, multi-worker mirrored), for benchmarks and tests of heterogeneous workers."""
    import time

    seconds = float(seconds)
    if seconds > 0:
        time.sleep(seconds)
    return seconds


def worker_wait(ids: Any, microseconds: Any) -> Any:
    """``ids`` after a sleep of ``microseconds`` on the worker that runs it (a slowed input pipeline, for
    benchmarks and tests of heterogeneous workers); a worker runs no Python, so the wait is tf.data's."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensors(ids)
    slept = tf.raw_ops.SleepDataset(input_dataset=tf.data.experimental.to_variant(dataset),
                                    sleep_microseconds=tf.cast(microseconds, tf.int64),
                                    output_types=[tf.int32], output_shapes=[tf.TensorShape([None])])
    return tf.data.experimental.from_variant(slept, tf.TensorSpec([None], tf.int32)).get_single_element()


def ps_workers() -> int:
    """The worker tasks of this parameter-server job (its TF_CONFIG)."""
    import os

    from tensorfleet.strategies.tf_config import parse_tf_config

    return parse_tf_config(os.environ.get("TF_CONFIG", "")).cluster.num_tasks("worker")
