"""The compiled backend's round layout and small graph helpers: :class:`RoundShape`,
:class:`NonTrainable` (what the server does with BatchNormalization's statistics),
:func:`default_lanes`.

Example:
    >>> RoundShape(batch_size=20, max_examples=100, clients_per_round=10).lanes is None
    True
    >>> NonTrainable("initial")
    <NonTrainable.INITIAL: 'initial'>
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["NonTrainable", "RoundShape", "default_lanes", "flatten", "fori", "lane_clients", "pad_clients",
           "trace_round"]


class NonTrainable(str, Enum):
    """What the server does with the model's non-trainable weights (BatchNormalization's moving statistics).

    ``mean``: every client starts from the server's and the server takes their mean weighted by
    examples after the round (the common practice). ``initial``: the server keeps them at their
    initial values (TFF's FedAvg, whose clients send trainable deltas only; the tff backend's behaviour).
    ``per_client``: FedBN (Li et al., ICLR 2021): every client keeps its own BatchNormalization layers,
    statistics and ``gamma``/``beta`` alike, across rounds; only the other weights are averaged
    (:mod:`~tensorfleet.federated.backends.compiled.local`; compiled backend only).
    """

    MEAN = "mean"
    INITIAL = "initial"
    PER_CLIENT = "per_client"


@dataclass(frozen=True)
class RoundShape:
    """How a round's data is laid out.

    Attributes:
        batch_size: local batch size.
        max_examples: the most examples (times local epochs) any client trains on in a round.
        clients_per_round: the round's client slots (the padded number of clients).
        lanes: how many clients train at once, each lane in its own copy of the model and its own
            ``tf.while_loop``, which TensorFlow runs side by side (None: :func:`default_lanes`);
            the result is the same up to the order of the sums.
    """

    batch_size: int
    max_examples: int
    clients_per_round: int
    lanes: int | None = None

def default_lanes(clients_per_round: int, cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Clients trained at once by default: one per CPU core this process may use (its CPU affinity,
    and a container's CPU quota from ``cpu_max``, cgroup v2's ``"<quota> <period>"``, rounded up),
    at most ``clients_per_round``. On two cores two lanes ran 113 rounds/s of the digits CNN, one 81
    and three or four 93 (bench/RESULTS.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cores = min(cores, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable: the affinity alone
    return max(1, min(int(clients_per_round), cores))


def flatten(tensors: Sequence[Any]) -> Any:
    """Tensors as one flat vector (in order)."""
    import tensorflow as tf

    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def fori(n: Any, body: Callable[[Any, Any], Any], init: Any) -> Any:
    """``for i in range(n): acc = body(i, acc)`` as a tf.while_loop."""
    import tensorflow as tf

    def cond(i: Any, acc: Any) -> Any:
        return i < n

    def loop(i: Any, acc: Any) -> Any:
        return i + 1, body(i, acc)

    return tf.while_loop(cond, loop, (tf.constant(0), init))[1]


def pad_clients(clients: Sequence[tuple[np.ndarray, np.ndarray]], slots: int, length: int) -> tuple[np.ndarray, ...]:
    """The clients' examples padded into a round's arrays: ``x [slots, length, ...]``, ``y [slots, length]``
    (labels one per example: shaped ``[1]``, as TFF's tutorials reshape them, they are the same labels)
    and each client's count ``[slots]``."""
    from tensorfleet.federated.backends.compiled.evaluate import one_label_per_example

    clients = [(xk, one_label_per_example(yk)) for xk, yk in clients]
    x0, y0 = clients[0]
    x = np.zeros((slots, length, *x0.shape[1:]), dtype=x0.dtype)
    y = np.zeros((slots, length), dtype=y0.dtype)
    examples = np.zeros((slots,), dtype=np.int32)
    for k, (xk, yk) in enumerate(clients):
        n = len(yk)
        x[k, :n], y[k, :n], examples[k] = xk, yk, n
    return x, y, examples


def trace_round(fn: Callable[..., Any], x: np.ndarray, y: np.ndarray) -> Any:
    """``fn(x, y, examples, participants, round_num)`` as a concrete function for arrays shaped as ``x``
    and ``y``: traced once, without AutoGraph (the round's loops are explicit; converting the model's and
    the optimizers' code costs seconds of start-up), or with it for a model that needs it."""
    import tensorflow as tf

    signature = [tf.TensorSpec(x.shape, x.dtype), tf.TensorSpec(y.shape, y.dtype),
                 tf.TensorSpec(x.shape[:1], tf.int32), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64)]
    try:
        return tf.function(fn, autograph=False).get_concrete_function(*signature)
    except tf.errors.OperatorNotAllowedInGraphError:  # Python control flow on tensors in the model
        return tf.function(fn, autograph=True).get_concrete_function(*signature)


def lane_clients(data: tuple[Any, ...], j: int, lanes: int, clients_per_round: int,
                 devices: Sequence[Any]) -> tuple[Any, ...]:
    """The round's ``data`` as lane ``j`` reads it: all of it in one process; on workers (``devices``) only
    the lane's clients ``j, j + lanes, ...``, sliced here, where the data is."""
    import tensorflow as tf

    if not devices:
        return data
    mine = tf.range(j, clients_per_round, lanes)
    return tuple(None if t is None else tf.gather(t, mine) for t in data)
