"""What ``model.fit`` needs under the active strategy, from arrays or a dataset factory.

Under every strategy but one, Keras takes a batched ``tf.data.Dataset``. The parameter server
(Keras 2: tf_keras, or TensorFlow 2.14's own) instead needs a ``DatasetCreator`` that each worker
calls to build its own input pipeline, repeated, plus an explicit ``steps_per_epoch``.
:func:`fit_inputs` and :func:`evaluate_inputs` return keyword arguments that fit either case, so
the user's call stays the same for every strategy::

    model.fit(**fit_inputs(x, y, batch_size=64), epochs=5)

Under the parameter server every worker runs the same dataset function, and TensorFlow gives
each the same ``InputContext`` (pipeline 0 of 1): a plain ``shard(num_input_pipelines,
input_pipeline_id)`` is a no-op there, and a fixed shuffle seed makes every worker feed the
identical batch sequence. The pipelines built here therefore read the worker's index at run
time (``tf.distribute.coordinator.experimental_get_current_worker_index()``): every worker
shuffles the examples alike (the same seed, reshuffled on every pass) and worker ``w`` of ``W``
keeps positions ``w, w + W, w + 2W, ...`` of that shared stream. The workers' examples are
disjoint, together they are the whole stream, and which examples a worker gets changes from pass
to pass. An epoch of ``ceil(n / batch_size)`` steps therefore feeds every example once when the
workers run equally many steps of it (``staleness=0`` keeps them within one step of each other);
when one worker runs more steps (asynchronous training with a straggler), it reads further ahead
in the stream, and the examples between are read by none or, later, by the slower worker.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from tensorfleet.compat import distribute as tf_internals
from tensorfleet.compat.keras import KERAS2_HOWTO, Keras3ModelError, is_keras3_model, keras2
from tensorfleet.validation import integer, positive_int

__all__ = ["FitInputs", "fit_inputs", "evaluate_inputs", "uses_coordinator"]


class FitInputs(Mapping[str, Any]):
    """Keyword arguments for ``model.fit`` / ``model.evaluate``: unpack with ``**``."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = {k: v for k, v in kwargs.items() if v is not None}

    def __getitem__(self, key: str) -> Any:
        return self._kwargs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kwargs)

    def __len__(self) -> int:
        return len(self._kwargs)

    def __repr__(self) -> str:
        return f"FitInputs({', '.join(f'{k}={type(v).__name__}' for k, v in self._kwargs.items())})"


def uses_coordinator(strategy: Any) -> bool:
    """True for strategies that Keras drives through a ClusterCoordinator (parameter server)."""
    return tf_internals.uses_coordinator(strategy)


def _current_strategy(strategy: Any, where: str) -> Any:
    """The strategy itself, a Keras model's strategy (either Keras), or the one in scope. A Keras 3 model under
    a parameter server is refused: Keras 3's own ``fit`` has no ClusterCoordinator."""
    import tensorflow as tf

    if strategy is None:
        return tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy
    model_strategy = getattr(strategy, "distribute_strategy", None)
    if isinstance(model_strategy, tf.distribute.Strategy):
        if is_keras3_model(strategy) and uses_coordinator(model_strategy):
            raise Keras3ModelError(
                f"{where} received a Keras 3 model built under a parameter-server strategy, and Keras 3's own fit "
                "has no parameter-server training (keras-team/keras#18624). Run it as a migratable job (`tensorfleet "
                "launch --strategy parameter_server --workers N --ps M job.py`: tensorfleet's own coordinator loop "
                "trains Keras 3 models), use multi_worker_mirrored, or build the model in tf_keras. "
                f"{KERAS2_HOWTO}")
        return model_strategy
    raise TypeError("strategy must be a tf.distribute.Strategy or a Keras model built under one. "
                    f"Received: strategy={type(strategy).__name__}")


def _check_arrays(x: Any, y: Any, batch_size: int) -> int:
    positive_int("batch_size", batch_size)
    n = len(x)
    if n == 0:
        raise ValueError("x is empty. Received: len(x)=0")
    if y is not None and len(y) != n:
        raise ValueError(f"x and y must have the same length. Received: len(x)={n}, len(y)={len(y)}")
    return n


def _num_workers(strategy: Any) -> int:
    """The worker count of a parameter-server strategy (what its ClusterCoordinator reads)."""
    return tf_internals.parameter_server_workers(strategy)


def _dataset_fn(x: Any, y: Any, batch_size: int, shuffle: bool, seed: int, repeat: bool,
                workers: int | None = None) -> Callable[[Any], Any]:
    """``input_context -> dataset`` of batches; with ``workers`` (a parameter server), the worker
    that builds it keeps every ``workers``-th element of the stream all workers share."""
    import tensorflow as tf

    x = np.asarray(x)
    y = None if y is None else np.asarray(y)

    def make(input_context: Any = None) -> Any:
        data = (x, y) if y is not None else x
        ds = tf.data.Dataset.from_tensor_slices(data)
        per_replica = batch_size
        if input_context is not None:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            per_replica = input_context.get_per_replica_batch_size(batch_size)
        if shuffle:  # a fixed seed: every worker's stream is the same sequence of permutations
            ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        if workers is not None:
            # TensorFlow gives every worker InputContext(0 of 1); the worker's index is fed in
            # when the function runs on that worker.
            ds = ds.shard(workers, tf.distribute.coordinator.experimental_get_current_worker_index())
        return ds.batch(per_replica).prefetch(2)

    return make


def _keyed_passes(x: Any, y: Any, batch_size: int, seed: int, step: Any) -> Any:
    """A dataset of one pass over ``(x, y)`` in batches, in an order that is a function of ``seed`` and of the
    epoch, which is ``step`` (the optimizer's step counter) read as the pass starts, over the pass's steps.

    A restarted job that resumes from a backup restores the step counter, so the epoch it resumes at reads
    its examples in the order the uninterrupted run read them; a reshuffling ``shuffle`` restarts its
    sequence of orders in every new process instead. Keras makes an iterator per epoch and the pass starts
    at the epoch's first read, inside its first step: nothing orders that read before or after the step's own
    increment of the counter (the iterator and the counter are separate resources), so it sees the epoch's
    first step count or the one after, and the division leaves the epoch either way. A pass of one step has
    one order (a batch's order does not change its gradient).
    """
    import tensorflow as tf

    n = len(x)
    steps = math.ceil(n / batch_size)
    xs = tf.constant(x)
    ys = None if y is None else tf.constant(y)
    base = tf.constant(seed, tf.int64)

    def order(_: Any) -> Any:
        epoch = tf.cast(tf.convert_to_tensor(step), tf.int64) // steps if steps > 1 else tf.constant(0, tf.int64)
        key = tf.stack([base, epoch])
        return tf.data.Dataset.from_tensor_slices(tf.argsort(tf.random.stateless_uniform([n], seed=key)))

    def gather(index: Any) -> Any:
        return tf.gather(xs, index) if ys is None else (tf.gather(xs, index), tf.gather(ys, index))

    batches = tf.data.Dataset.from_tensors(0).flat_map(order).batch(batch_size).map(gather)
    # flat_map hides the length: said again, so that Keras knows an epoch's steps from the first epoch on
    return batches.apply(tf.data.experimental.assert_cardinality(steps)).prefetch(2)


def _step_counter(model: Any) -> Any:
    """The optimizer's step counter of a compiled Keras model (either Keras), else None (a strategy, or a model
    not compiled yet)."""
    return getattr(getattr(model, "optimizer", None), "iterations", None)


def fit_inputs(
    x: Any,
    y: Any = None,
    *,
    batch_size: int = 32,
    strategy: Any = None,
    shuffle: bool = True,
    seed: int = 0,
    validation_data: tuple[Any, Any] | None = None,
    dataset_fn: Callable[[Any], Any] | None = None,
    steps_per_epoch: int | None = None,
) -> FitInputs:
    """Keyword arguments for ``model.fit`` under ``strategy`` (default: the current one).

    Args:
        x, y: arrays of examples and labels (or ``dataset_fn`` instead).
        batch_size: the global batch size, split across replicas.
        strategy: the Keras model (its strategy is used) or the strategy it was built
            under; default the strategy in scope. Pass it: the parameter server needs
            different inputs than every other strategy.
        shuffle, seed: shuffling of the examples. Given a compiled model (``strategy=model``), each
            epoch's order is a function of ``seed`` and of the optimizer's step count as the epoch
            starts: a job resumed from a backup (:func:`tensorfleet.cluster.callbacks`) reads each
            epoch in the order the uninterrupted run read it, and Keras 3's fit (which reads a batch
            to build the model first) reads the same orders with and without a strategy. Given a
            strategy instead, a seeded shuffle reshuffled on every pass, whose sequence of orders
            starts again in every process. Under the parameter server every worker shuffles alike
            and worker ``w`` of ``W`` keeps every W-th example from position ``w`` on: the workers
            read disjoint examples (see the module docstring).
        validation_data: ``(x_val, y_val)`` arrays.
        dataset_fn: instead of arrays, a function ``(input_context) -> tf.data.Dataset`` of
            batches; requires ``steps_per_epoch``. Under the parameter server it runs on every
            worker with the same ``input_context``: shard or seed it by
            ``tf.distribute.coordinator.experimental_get_current_worker_index()``.
        steps_per_epoch: default ``ceil(len(x) / batch_size)``.

    Raises:
        tensorfleet.compat.keras.Keras3ModelError: ``strategy`` is a Keras 3 model under a parameter server
            (Keras 3's ``fit`` has none).

    Example:
        >>> import tensorflow as tf
        >>> import tensorfleet as tfl
        >>> data = tfl.models.datasets.load_digits(flat=True)
        >>> x, y = data.x_train[:256], data.y_train[:256]
        >>> strategy = tfl.strategies.build("mirrored")
        >>> with strategy.scope():
        ...     model = tfl.models.build("digits_mlp")
        ...     model.compile(optimizer="adam",
        ...                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> inputs = fit_inputs(x, y, batch_size=64, strategy=model)
        >>> inputs
        FitInputs(x=_PrefetchDataset, shuffle=bool)
        >>> history = model.fit(**inputs, epochs=2, verbose=0)
        >>> len(history.history["loss"])
        2
    """

    model = strategy
    strategy = _current_strategy(strategy, "fit_inputs")
    coordinated = uses_coordinator(strategy)
    if dataset_fn is not None:
        if x is not None and not callable(x):
            raise ValueError("Pass either arrays (x, y) or dataset_fn, not both.")
        if steps_per_epoch is None:
            raise ValueError("dataset_fn needs steps_per_epoch (a dataset factory has no known length). "
                             "Received: steps_per_epoch=None")
        make = dataset_fn
    else:
        n = _check_arrays(x, y, batch_size)
        steps_per_epoch = steps_per_epoch or math.ceil(n / batch_size)
        make = _dataset_fn(x, y, batch_size, shuffle, seed, repeat=coordinated,
                           workers=_num_workers(strategy) if coordinated else None)
    integer("steps_per_epoch", steps_per_epoch, minimum=1, optional=True)
    validation: dict[str, Any] = {}
    if validation_data is not None:
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
            raise ValueError("validation_data must be a pair (x_val, y_val) of arrays. "
                             f"Received: {type(validation_data).__name__}")
        validation = dict(evaluate_inputs(*validation_data, batch_size=batch_size, strategy=strategy))
        validation = {"validation_data": validation["x"], "validation_steps": validation.get("steps")}
    if coordinated or dataset_fn is not None:
        # Keras calls a DatasetCreator once per worker with its InputContext.
        return FitInputs(x=keras2().utils.experimental.DatasetCreator(make), steps_per_epoch=steps_per_epoch,
                         **validation)
    step = _step_counter(model) if shuffle else None
    dataset = make(None) if step is None else _keyed_passes(np.asarray(x), None if y is None else np.asarray(y),
                                                           batch_size, seed, step)
    # The dataset is shuffled already; Keras 3's fit warns that its own shuffle=True is ignored otherwise.
    return FitInputs(x=dataset, shuffle=False, **validation)


def evaluate_inputs(x: Any, y: Any = None, *, batch_size: int = 32, strategy: Any = None) -> FitInputs:
    """Keyword arguments for ``model.evaluate`` under ``strategy``.

    Every example once, except under the parameter server: there worker ``w`` of ``W`` reads
    every W-th example from position ``w`` on, repeated, for the ``ceil(n / batch_size)`` steps
    Keras hands out to whichever worker is free, so the examples are covered once only when the
    workers run equally many of those steps.
    """

    strategy = _current_strategy(strategy, "evaluate_inputs")
    n = _check_arrays(x, y, batch_size)
    if uses_coordinator(strategy):
        # Each worker reads every W-th example, repeated; Keras cuts the steps at ceil(n / batch).
        make = _dataset_fn(x, y, batch_size, shuffle=False, seed=0, repeat=True, workers=_num_workers(strategy))
        return FitInputs(x=keras2().utils.experimental.DatasetCreator(make), steps=math.ceil(n / batch_size))
    return FitInputs(x=_dataset_fn(x, y, batch_size, shuffle=False, seed=0, repeat=False)(None))
