"""A Keras 3 model's state under a parameter server: every step's update applied, whichever worker runs it.

Keras 3 has no parameter-server training (keras-team/keras#18624); tensorfleet's migratable jobs schedule
Keras 3 steps on the workers themselves (:mod:`tensorfleet.cluster.resumable`). The model's variables live on
the ps tasks, and steps on two workers run at once. Where a step updates a variable with a read and then a
write of the whole new value (Keras 3's ``Variable.assign``, and its ``assign_add``, which is
``assign(self + value)``), two steps that both read before either writes leave one update: measured in a
2-worker, 1-ps job of 48 steps (Keras 3.15.1, TensorFlow 2.21), Dropout's seed generator advanced 43 times and
BatchNormalization's moving mean moved as 42 steps would move it; the optimizer counted 24 steps of 26.

:func:`make_updates_atomic` gives each of those variables one atomic op on the ps, as tf_keras has there:

* the optimizer's step count: ``tf.Variable.assign_add`` (tf_keras counts so);
* every ``SeedGenerator`` of the model's layers (Dropout, GaussianNoise, the random augmentation layers):
  the seed is read, then the state advanced with ``tf.Variable.assign_add`` (tf_keras's generators read and
  skip in one op; here two steps that start at once may draw the same seed, but no step goes uncounted);
* every ``BatchNormalization`` (without ``renorm``): its moving mean and variance move as tf_keras's do
  (``_assign_moving_average``), ``variable.assign_sub((variable - batch statistic) * (1 - momentum))``, the
  batch statistics from the layer's own ``_moments``. The layer's output is Keras 3's own; only its two
  ``assign`` calls are held back in training. A delta computed from a read that another worker's update
  then follows is applied all the same, as under tf_keras: no update is lost, and the statistics equal one
  process's only when the steps do not overlap.

A ``BatchNormalization(renorm=True)`` keeps Keras 3's own updates (its renorm statistics have no delta form
here); a warning says so. Everything is per object (instance attributes), so other models in the process are
left as they are.

Example:
    >>> from tensorfleet.compat import keras3_ps
    >>> keras3_ps.UPSTREAM_ISSUE
    'keras-team/keras#18624'
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

__all__ = ["UPSTREAM_ISSUE", "atomic_step_count", "make_updates_atomic"]

log = logging.getLogger(__name__)

UPSTREAM_ISSUE = "keras-team/keras#18624"
"""Keras 3's missing parameter-server training."""


def make_updates_atomic(model: Any) -> int:
    """Makes the step-time updates of a Keras 3 ``model`` (its optimizer's count, its layers' seed generators
    and BatchNormalization statistics) atomic on a parameter server: see the module. Call it once, after the
    model and its optimizer are built under the strategy's scope.

    Returns:
        How many seed generators and BatchNormalization layers were made atomic (the count not included).
    """
    import keras

    if model.optimizer is not None:
        atomic_step_count(model.optimizer)
    from tensorfleet.compat.keras3_checkpoints import seed_generators

    made = 0
    for generator in seed_generators(model):
        _atomic_seed(generator)
        made += 1
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            if layer.renorm:
                log.warning("BatchNormalization %r has renorm=True: its statistics keep Keras 3's own read-then-write "
                            "update, which steps running at once on several workers can lose.", layer.name)
                continue
            _atomic_moving_statistics(layer)
            made += 1
    return made


def atomic_step_count(optimizer: Any) -> None:
    """Makes a Keras 3 optimizer count its steps with one atomic add on its variable.

    Keras 3's ``Variable.assign_add`` is ``assign(self + value)``: a read, then a write. Under a parameter
    server, two steps that read the count before either writes it count once (measured: 24 steps counted of
    26 run); Adam's bias correction reads that count. Its slot and weight updates go through
    ``tf.Variable.assign_add``/``_sub`` already (one op on the ps, atomic); the count is made to as well. The
    counter is ``optimizer._iterations`` (``iterations`` is a derived value under gradient accumulation); the
    override is its own, an instance attribute.
    """
    import tensorflow as tf

    counter = optimizer._iterations
    variable = counter.value  # the tf.Variable (on the ps) behind the Keras variable

    def assign_add(value: Any) -> Any:
        return variable.assign_add(tf.cast(value, variable.dtype))

    counter.assign_add = assign_add


def _atomic_seed(generator: Any) -> None:
    """A ``SeedGenerator`` whose ordered ``next`` reads the seed, then advances the state with one atomic add
    (Keras 3's own: ``state.assign(state + [0, 1])``). The unordered path (``next(ordered=False)``, the global
    generator's) is Keras 3's own."""
    import tensorflow as tf

    original = generator.next
    variable = generator.state.value

    def next(ordered: bool = True) -> Any:  # noqa: A001 (Keras 3's name)
        if not ordered:
            return original(ordered=False)
        seed = variable.read_value()
        with tf.control_dependencies([seed]):
            variable.assign_add(tf.constant([0, 1], variable.dtype))
        return seed

    generator.next = next


@contextlib.contextmanager
def _held(*variables: Any) -> Iterator[None]:
    """Inside, ``assign`` of each Keras 3 variable does nothing (an instance attribute, removed afterwards)."""
    for variable in variables:
        variable.assign = lambda value: None
    try:
        yield
    finally:
        for variable in variables:
            del variable.assign


def _atomic_moving_statistics(layer: Any) -> None:
    """A ``BatchNormalization`` layer whose moving statistics move by one atomic ``assign_sub`` each, as
    tf_keras's do (see the module); its outputs are Keras 3's own ``call``'s."""
    import tensorflow as tf
    from keras import backend, ops

    original = layer.call

    def call(inputs: Any, training: Any = None, mask: Any = None) -> Any:
        if not (training and layer.trainable):
            return original(inputs, training=training, mask=mask)
        with _held(layer.moving_mean, layer.moving_variance):
            outputs = original(inputs, training=training, mask=mask)
        x = ops.cast(inputs, backend.result_type(inputs.dtype, "float32"))
        statistics = layer._moments(x, mask)
        decay = 1.0 - layer.momentum
        for moving, statistic in zip((layer.moving_mean, layer.moving_variance), statistics):
            variable = moving.value
            variable.assign_sub((variable - tf.cast(statistic, variable.dtype)) * decay)
        return outputs

    object.__setattr__(layer, "call", call)
