"""Local SGD under ``multi_worker_mirrored``: replicas step on their own and average their weights every H steps.

Lin, Stich, Patel and Jaggi, "Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020), after Stich, "Local
SGD Converges Fast and Communicates Little" (ICLR 2019): each of the K replicas takes H steps of SGD on its
own batches, then all replicas replace their weights by the mean, ``w = (1/K) sum_k w_k``. One all-reduce of
the weights per H steps replaces H all-reduces of the gradients. Post-local SGD (Lin et al., section 3) runs
the first ``sync_steps`` steps synchronously (ordinary data parallelism) and locally after.

:class:`LocalSGD` is the callback, for the model's Keras (Keras 3 or tf_keras). When training starts it
puts its own ``train_function`` in the model's place: the model's ``train_step`` on each replica with the
gradient all-reduce taken out of the optimizer (:func:`tensorfleet.compat.local_sgd.local_gradients`), the
batch taken without the workers' per-step agreement on whether data is left (so every worker needs as many
batches: ``drop_remainder=True`` or ``steps_per_epoch``), the logs of this worker's replicas (no collective
either); after every H of those steps it runs one averaging
function, an all-reduce mean of every floating-point weight and of the optimizer's state (momentum, Adam's
moments: the paper keeps them local between averagings, and so does this; averaging them too makes every
averaging a state one checkpoint holds for all workers) through the strategy's collectives. The weights are also
averaged after the last step of each epoch, so the checkpoint a ``BackupAndRestore`` takes at the epoch's end is the
same on every worker and a resumed run continues from it; validation sees the averaged model.

Why a callback and not a strategy option: the strategy stays TensorFlow's own (a script switches local SGD
on and off with one line in ``callbacks=``), the change is to Keras's training loop, where Keras users put
what changes it (``BackupAndRestore``, learning-rate schedules), and the same object works in both Kerases.

The all-reduces are counted, not computed: :attr:`LocalSGD.all_reduces` is, for each function it ran, the
collective ops of its traced graph (one per all-reduce and local replica) times how often it ran.

Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> callback = LocalSGD(every=4, keras=model)
    >>> callback.every, callback.sync_steps, isinstance(callback, keras.callbacks.Callback)
    (4, 0, True)
    >>> LocalSGD(every=0, keras=model)
    Traceback (most recent call last):
    ...
    ValueError: every must be a positive integer. Received: every=0
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tensorfleet.compat import local_sgd as internals
from tensorfleet.compat.keras import Keras, as_keras, keras_module, tf_variable
from tensorfleet.strategies.large_batch import check_callback_keras
from tensorfleet.validation import integer

__all__ = ["AllReduceCount", "LocalSGD", "callback_class", "step_all_reduces"]

log = logging.getLogger(__name__)

_REFUSED = {
    "ParameterServerStrategy": "the variables live on the ps tasks: a worker has no weights of its own to step",
    "CentralStorageStrategy": "the variables are kept once, on one device: the replicas have no copies of their own",
    "OneDeviceStrategy": "one replica has nobody to average with",
    "TPUStrategy": "not implemented for TPUs",
}


class AllReduceCount(dict[str, int]):
    """All-reduces by where they ran: ``sync_steps``, ``local_steps``, ``averaging`` (see :meth:`total`)."""

    def total(self) -> int:
        """All-reduces in all."""
        return sum(self.values())


def _check_strategy(strategy: Any) -> None:
    import tensorflow as tf

    name = type(strategy).__name__
    for refused, why in _REFUSED.items():
        if refused in name:
            raise TypeError(f"local SGD needs replicas with weights of their own (multi_worker_mirrored or "
                            f"mirrored); under {name} {why}. Received: strategy of type {name}.")
    if not isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        raise TypeError("local SGD needs the model built under multi_worker_mirrored (or mirrored) strategy.scope(). "
                        f"Received: strategy of type {name}")
    compression = _compression_of(strategy)
    if compression is not None:
        raise ValueError("local SGD averages weights, not gradients, and cannot combine with compressed gradient "
                         f"all-reduce. Received: compression={compression!r}; build the strategy without it.")


def _compression_of(strategy: Any) -> str | None:
    """The ``compression=`` the strategy was built with (None without, or with ``"none"``, Keras's own sum)."""
    from tensorfleet.strategies.compression import traffic

    try:
        method = traffic(strategy).method
    except ValueError:  # built without the option
        return None
    return None if method == "none" else method


def _local(strategy: Any, value: Any) -> Any:
    import tensorflow as tf

    parts = strategy.experimental_local_results(value)
    return parts[0] if len(parts) == 1 else tf.add_n(list(parts)) / len(parts)


class LocalSGD:
    """A callback that trains each replica on its own and averages the replicas' weights every ``every`` steps.

    ``LocalSGD(...)`` makes an instance of the class for the chosen Keras (:func:`callback_class`: a subclass of
    this one and of that Keras's ``callbacks.Callback``). Put it first in ``callbacks=`` (before
    ``BackupAndRestore``): it averages after the last step of each epoch, before a checkpoint is written.

    Args:
        every: H, the local steps between two averagings (1 averages after every step: the weights then
            follow synchronous SGD, with an all-reduce of the weights in place of one of the gradients).
        sync_steps: post-local SGD: the first ``sync_steps`` optimizer steps (counted by the optimizer, so a
            resumed run knows where it is) run Keras's synchronous step; local SGD after.
        keras: the model that will ``fit`` (its Keras), ``"keras3"`` or ``"keras2"``; None for ``tf.keras``'s.

    Raises:
        ValueError: ``every`` < 1 or ``sync_steps`` < 0; when training starts, ``steps_per_execution`` other than
            1, ``run_eagerly``, or a strategy with compressed all-reduce.
        TypeError (when training starts): a strategy other than multi_worker_mirrored or mirrored
            (parameter_server, central_storage, one_device, tpu).

    Example:
        >>> callback = LocalSGD(every=16, sync_steps=100, keras="keras3")
        >>> callback.every, callback.sync_steps, isinstance(callback, LocalSGD)
        (16, 100, True)
    """

    keras: Keras
    # Set by the Keras callbacks.Callback this class is combined with (callback_class):
    model: Any
    params: dict[str, Any]

    def __new__(cls, *, every: int, sync_steps: int = 0, keras: Keras | str | Any = None) -> Any:
        if cls is LocalSGD:
            cls = callback_class(keras)
        return object.__new__(cls)

    def __init__(self, *, every: int, sync_steps: int = 0, keras: Keras | str | Any = None) -> None:
        super().__init__()
        self.every = integer("every", every, minimum=1)
        self.sync_steps = integer("sync_steps", sync_steps, minimum=0)
        self._since_average = 0
        self._runs = {"sync_steps": 0, "local_steps": 0, "averaging": 0}
        self._keras_function: Any = None
        self._step: Any = None
        self._average: Any = None
        self._strategy: Any = None
        self._steps_per_epoch: int | None = None
        self._steps_done = 0

    def set_model(self, model: Any) -> None:
        check_callback_keras(self, model, "LocalSGD")
        super().set_model(model)  # type: ignore[misc]

    # ------------------------------------------------------------------ the functions

    def _make_functions(self) -> None:
        import tensorflow as tf

        model, strategy = self.model, self._strategy
        replicas = strategy.num_replicas_in_sync

        @tf.function(autograph=False, reduce_retracing=True)
        def local_step(iterator: Any) -> Any:
            data = internals.next_local_batch(iterator)
            with internals.local_gradients(model.optimizer, replicas), internals.local_metrics(model):
                outputs = strategy.run(model.train_step, args=(data,))
            return tf.nest.map_structure(lambda v: _local(strategy, v), outputs)

        # The optimizer's state too: every averaging then leaves one state on all workers, and a backup taken
        # after it resumes exactly (measured: with each worker's Adam moments kept local, a run stopped after
        # epoch 2 and resumed ended 0.027 from the unbroken one; averaged, equal).
        variables = [v for v in map(tf_variable, [*model.weights, *model.optimizer.variables]) if v.dtype.is_floating]

        def assign(distribution: Any, means: list[Any]) -> None:
            for variable, mean in zip(variables, means):
                distribution.extended.update(variable, lambda v, m: v.assign(m), args=(mean,), group=False)

        def replica_average() -> None:
            context = tf.distribute.get_replica_context()
            means = context.all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(v) for v in variables])
            context.merge_call(assign, args=(means,))

        @tf.function(autograph=False)
        def average() -> None:
            strategy.run(replica_average)

        self._step, self._average = local_step, average

    def _train_function(self, iterator: Any) -> Any:
        if self._steps_done < self.sync_steps:
            logs = self._keras_function(iterator)
            self._runs["sync_steps"] += 1
        else:
            logs = self._step(iterator)
            self._runs["local_steps"] += 1
            self._since_average += 1
        self._steps_done += 1
        return logs

    def average(self) -> None:
        """Averages the replicas' weights now (every worker must call it: it is a collective)."""
        if self._since_average:
            self._average()
            self._runs["averaging"] += 1
            self._since_average = 0

    # ------------------------------------------------------------------ the callback

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        self._strategy = model.distribute_strategy
        _check_strategy(self._strategy)
        steps_per_execution = getattr(model, "steps_per_execution", 1)
        steps_per_execution = int(getattr(steps_per_execution, "numpy", lambda: steps_per_execution)())
        if steps_per_execution != 1:
            raise ValueError("local SGD counts and averages between steps and needs one step per call. Received: "
                             f"steps_per_execution={steps_per_execution}; compile with steps_per_execution=1.")
        if getattr(model, "run_eagerly", False):
            raise ValueError("local SGD runs its steps as tf.functions. Received: run_eagerly=True")
        self._steps_per_epoch = self.params.get("steps") if self.params else None
        self._since_average = 0
        self._steps_done = int(model.optimizer.iterations.numpy())
        self._make_functions()
        self._keras_function = model.train_function
        model.train_function = self._train_function
        log.info("local SGD: %d replicas average their weights every %d steps (synchronous for the first %d)",
                 self._strategy.num_replicas_in_sync, self.every, self.sync_steps)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        last_of_epoch = self._steps_per_epoch is not None and batch + 1 == self._steps_per_epoch
        if self._since_average >= self.every or (last_of_epoch and self._since_average):
            self.average()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.average()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.average()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.average()
        if self._keras_function is not None:
            self.model.train_function = self._keras_function
            self._keras_function = None

    # ------------------------------------------------------------------ counts

    @property
    def runs(self) -> dict[str, int]:
        """How often each function ran: Keras's synchronous step, the local step, the averaging."""
        return dict(self._runs)

    @property
    def all_reduces(self) -> AllReduceCount:
        """All-reduces this worker took part in so far (training steps and averaging; the epoch-end reads of the
        metrics, as in any fit, not counted): the collective ops of each traced function / local replicas x
        its runs."""
        local = len(self._strategy.extended.worker_devices) if self._strategy is not None else 1
        functions = {"sync_steps": self._keras_functions(), "local_steps": [self._step],
                     "averaging": [self._average]}
        return AllReduceCount({
            where: self._runs[where] * sum(internals.collectives(f) for f in fs if f is not None) // local
            for where, fs in functions.items()})

    def _keras_functions(self) -> list[Any]:
        function = self._keras_function or getattr(self.model, "train_function", None)
        if function is None or function == self._train_function or not self._runs["sync_steps"]:
            return []
        return internals.keras_train_functions(function)


@functools.cache
def _callback_class(which: Keras) -> type:
    base = keras_module(which).callbacks.Callback
    return type("LocalSGD", (LocalSGD, base),
                {"__module__": __name__, "__doc__": LocalSGD.__doc__, "__qualname__": "LocalSGD", "keras": which})


def callback_class(keras: Keras | str | Any = None) -> type:
    """The local SGD callback class for one Keras (a subclass of its ``callbacks.Callback``).

    Args:
        keras: ``"keras3"``, ``"keras2"``, a Keras model (its Keras), or None for the Keras ``tf.keras`` is here.
    """
    return _callback_class(as_keras(keras, "local_sgd.callback_class"))


def step_all_reduces(model: Any) -> int:
    """All-reduces one call of the model's own ``train_function`` runs (plain synchronous training), measured
    from its traced graph: its collective ops / the worker's local replicas. Call it after ``fit``.

    Raises:
        TypeError: the model has not trained yet (no traced train function) or runs eagerly.
    """
    function = getattr(model, "train_function", None)
    if function is None:
        raise TypeError("step_all_reduces reads the graph of the model's train function, made by fit. Received: a "
                        "model whose train_function is None; call it after fit.")
    local = len(model.distribute_strategy.extended.worker_devices)
    return sum(internals.collectives(f) for f in internals.keras_train_functions(function)) // local
