"""TensorFlow's thread pools for a process that runs compiled simulations.

The compiled backend trains a round's clients in lanes, one per core, each a ``tf.while_loop``
that TensorFlow's inter-op threads run side by side. TensorFlow's default pools also split every
op's own work over an intra-op pool of one thread per core: on the small models of federated
experiments each op's work is split over the cores the other lanes are using, and the hand-offs
cost more than they save. With one intra-op thread (each op runs on the thread of its lane) and an
inter-op thread per lane plus one, the digits CNN's round took 6.2-7.7 ms on 2 cores where
TensorFlow's pools took 9.7-11 ms, and every cell of the bench's algorithm x aggregator matrix ran
1.2-1.9x faster (bench/RESULTS.md). Raw TFF gains nothing from it: its rounds run in its own worker
process. The arithmetic is the same; sums taken on other threads may round in another order, so a
run's last digits can differ from one on TensorFlow's pools, as from one on another machine.

The pools belong to the process and are fixed when TensorFlow's runtime starts (the first op,
model or device query), so this is a call to make first rather than something a
:class:`~tensorfleet.federated.Simulation` can do for itself; ``tensorfleet federated run`` makes
it unless told ``--tf-threads tensorflow``. ``TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=3``
in the environment does the same for two lanes.

Example:
    >>> import tensorfleet as tfl
    >>> tfl.federated.configure_threads(clients_per_round=10)   # doctest: +SKIP
    (1, 3)
"""

from __future__ import annotations

from tensorfleet.federated.backends.compiled import default_lanes

__all__ = ["configure_threads", "thread_pools"]


def configure_threads(clients_per_round: int = 10, lanes: int | None = None, *,
                      strict: bool = True) -> tuple[int, int] | None:
    """Sets TensorFlow's pools for compiled simulations: one intra-op thread, and an inter-op thread
    per lane plus one (lanes: :func:`~tensorfleet.federated.backends.compiled.default_lanes` of
    ``clients_per_round`` unless given). Returns ``(intra_op, inter_op)``; None if TensorFlow's
    runtime had started with other pools and not ``strict``.

    Raises:
        RuntimeError: TensorFlow's runtime has already started with other pools (when ``strict``).
    """
    from tensorfleet.validation import integer

    lanes = default_lanes(integer("clients_per_round", clients_per_round, minimum=1)) if lanes is None else \
        integer("lanes", lanes, minimum=1)
    wanted = (1, lanes + 1)
    if thread_pools() == wanted:
        return wanted
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(wanted[0])
        tf.config.threading.set_inter_op_parallelism_threads(wanted[1])
    except RuntimeError as exc:
        if not strict:
            return None
        raise RuntimeError(
            f"TensorFlow's thread pools are fixed once its runtime starts, and it has started (intra-op, inter-op "
            f"= {thread_pools()}; 0 is TensorFlow's default). Call configure_threads() before anything builds "
            f"a model or runs an op, or set TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS={wanted[1]} in the "
            "environment.") from exc
    return wanted


def thread_pools() -> tuple[int, int]:
    """``(intra_op, inter_op)`` threads of TensorFlow's pools in this process as configured (by
    :func:`configure_threads`, TensorFlow's API or ``TF_NUM_INTRAOP_THREADS`` and
    ``TF_NUM_INTEROP_THREADS``); 0 where TensorFlow picks (one per core)."""
    import os

    import tensorflow as tf

    def configured(api: int, env: str) -> int:
        if api:
            return api
        try:
            return max(0, int(os.environ.get(env, "0")))
        except ValueError:
            return 0

    return (configured(tf.config.threading.get_intra_op_parallelism_threads(), "TF_NUM_INTRAOP_THREADS"),
            configured(tf.config.threading.get_inter_op_parallelism_threads(), "TF_NUM_INTEROP_THREADS"))
