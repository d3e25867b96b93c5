"""The learning rate for the global batch: scaled with it, warmed up over the first epochs or steps.

Adding replicas multiplies the global batch (``num_replicas_in_sync`` x the per-replica batch). Goyal
et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (arXiv:1706.02677): scale
the learning rate linearly with the global batch, ``lr = base_lr * global_batch / reference_batch``,
and reach it by a gradual warm-up, linear per step from ``base_lr`` over the first epochs (5 there).
The square-root rule (``lr = base_lr * sqrt(global_batch / reference_batch)``, Krizhevsky 2014 "One
weird trick") is the other common choice, mostly for adaptive optimizers.

:func:`scaled_learning_rate` makes the callback for the model's Keras (Keras 3 or tf_keras). It
sets the optimizer's learning rate at the start of training and at every step of the warm-up, then
leaves it alone (other schedules may take over). The global batch is given, or read when training
starts from the model's strategy and the per-replica batch: a job restarted with another number of
replicas (the elastic ``keep_per_replica`` policy) gets the rate of its new global batch.

Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> callback = scaled_learning_rate(base_lr=0.1, reference_batch=32, global_batch=512, keras=model)
    >>> round(callback.target_lr, 6), isinstance(callback, keras.callbacks.Callback)
    (1.6, True)
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import numbers
from typing import Any

from tensorfleet.compat.keras import Keras, as_keras, keras_module, keras_of
from tensorfleet.validation import choice, integer, number, positive_int

__all__ = ["ScalingRule", "callback_class", "check_callback_keras", "check_settable", "parse_scale_lr",
           "scaled_learning_rate", "scaled_learning_rate_for", "scaled_lr", "warmup_lr"]

log = logging.getLogger(__name__)


class ScalingRule(str, enum.Enum):
    """How the learning rate follows the global batch."""

    LINEAR = "linear"
    """``base_lr * global_batch / reference_batch`` (Goyal et al. 2017)."""
    SQRT = "sqrt"
    """``base_lr * sqrt(global_batch / reference_batch)``."""


def scaled_lr(base_lr: float, *, global_batch: int, reference_batch: int, rule: ScalingRule | str = "linear") -> float:
    """The learning rate for ``global_batch``, given ``base_lr`` at ``reference_batch``.

    Example:
        >>> (scaled_lr(0.1, global_batch=256, reference_batch=32),
        ...  scaled_lr(0.1, global_batch=128, reference_batch=32, rule="sqrt"))
        (0.8, 0.2)
    """
    base_lr = number("base_lr", base_lr, above=0)
    ratio = positive_int("global_batch", global_batch) / positive_int("reference_batch", reference_batch)
    return base_lr * (ratio if choice(ScalingRule, "rule", rule) is ScalingRule.LINEAR else math.sqrt(ratio))


def warmup_lr(step: int, *, warmup_steps: int, start_lr: float, target_lr: float) -> float:
    """The learning rate at ``step`` (from 0) of a linear warm-up from ``start_lr`` to ``target_lr`` over
    ``warmup_steps`` steps; ``target_lr`` from step ``warmup_steps`` on (and with no warm-up).

    Example:
        >>> [warmup_lr(s, warmup_steps=4, start_lr=0.1, target_lr=0.5) for s in range(6)]
        [0.1, 0.2, 0.30000000000000004, 0.4, 0.5, 0.5]
    """
    integer("step", step, minimum=0)
    if step >= integer("warmup_steps", warmup_steps, minimum=0):
        return target_lr
    return start_lr + (target_lr - start_lr) * step / warmup_steps


def check_settable(optimizer: Any) -> None:
    """Refuses an optimizer whose learning rate is a schedule (it cannot be set)."""
    config = optimizer.get_config().get("learning_rate")
    if isinstance(config, numbers.Real):
        return
    what = config.get("class_name", config) if isinstance(config, dict) else config
    raise TypeError(f"scaled_learning_rate sets the optimizer's learning rate, and {type(optimizer).__name__}'s "
                    f"learning rate is a schedule it cannot set. Received: learning_rate={what!r}; give the "
                    "optimizer a float learning rate (scaled_learning_rate then scales and warms it up).")


class _LearningRateScaling:
    """Sets the optimizer's learning rate for the global batch, warmed up; made by :func:`scaled_learning_rate`."""

    keras: Keras
    # Set by the Keras callbacks.Callback this class is combined with (callback_class):
    model: Any
    params: dict[str, Any]

    def __init__(self, *, base_lr: float, reference_batch: int, global_batch: int | None, per_replica_batch: int | None,
                 strategy: Any, rule: ScalingRule | str, warmup_epochs: int, warmup_steps: int | None,
                 warmup_start_lr: float | None) -> None:
        super().__init__()
        self.base_lr = number("base_lr", base_lr, above=0)
        self.reference_batch = positive_int("reference_batch", reference_batch)
        self.rule = choice(ScalingRule, "rule", rule)
        if (global_batch is None) == (per_replica_batch is None):
            raise ValueError("give one of global_batch (examples per step over all replicas) or per_replica_batch "
                             "(the global batch is then per_replica_batch x the strategy's num_replicas_in_sync). "
                             f"Received: global_batch={global_batch!r}, per_replica_batch={per_replica_batch!r}")
        if global_batch is not None and strategy is not None:
            raise ValueError("strategy= serves per_replica_batch only; with global_batch it does not apply. "
                             f"Received: global_batch={global_batch!r}, strategy={strategy!r}")
        self._global_batch = None if global_batch is None else positive_int("global_batch", global_batch)
        self.per_replica_batch = None if per_replica_batch is None else positive_int("per_replica_batch",
                                                                                     per_replica_batch)
        self.strategy = strategy
        integer("warmup_epochs", warmup_epochs, minimum=0)
        if warmup_steps is not None and warmup_epochs:
            raise ValueError("give warmup_epochs or warmup_steps, not both. "
                             f"Received: warmup_epochs={warmup_epochs!r}, warmup_steps={warmup_steps!r}")
        self.warmup_epochs = warmup_epochs
        self.warmup_steps = None if warmup_steps is None else integer("warmup_steps", warmup_steps, minimum=0)
        self.warmup_start_lr = (self.base_lr if warmup_start_lr is None
                                else number("warmup_start_lr", warmup_start_lr, above=0))
        self._epoch = 0
        self._steps_per_epoch: int | None = None
        self._seen = 0
        self._warmup_total = 0

    @property
    def global_batch(self) -> int | None:
        """The global batch: as given, or as read when training last started (None before)."""
        return self._global_batch

    @property
    def target_lr(self) -> float | None:
        """The learning rate after the warm-up, for :attr:`global_batch` (None before it is known)."""
        if self._global_batch is None:
            return None
        return scaled_lr(self.base_lr, global_batch=self._global_batch, reference_batch=self.reference_batch,
                         rule=self.rule)

    def set_model(self, model: Any) -> None:
        check_callback_keras(self, model, "scaled_learning_rate")
        super().set_model(model)  # type: ignore[misc]

    def _resolve_global_batch(self) -> None:
        if self.per_replica_batch is None:
            return
        strategy = self.strategy if self.strategy is not None else self.model.distribute_strategy
        replicas = getattr(strategy, "num_replicas_in_sync", None)
        if not isinstance(replicas, int) or replicas < 1:
            raise TypeError("strategy must be a tf.distribute strategy (with num_replicas_in_sync). "
                            f"Received: strategy of type {type(strategy).__name__}")
        self._global_batch = self.per_replica_batch * replicas

    def _set(self, value: float) -> None:
        self.model.optimizer.learning_rate = value

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        check_settable(self.model.optimizer)
        self._resolve_global_batch()
        self._steps_per_epoch = self.params.get("steps") if self.params else None
        if self.warmup_steps is not None:
            self._warmup_total = self.warmup_steps
        elif self.warmup_epochs:
            if not self._steps_per_epoch:
                raise ValueError("warmup_epochs needs the number of steps per epoch, and fit does not know it (a "
                                 "dataset of unknown length). Received: steps per epoch=None; pass "
                                 "steps_per_epoch= to fit, or warmup_steps= to scaled_learning_rate.")
            self._warmup_total = self.warmup_epochs * self._steps_per_epoch
        self._seen = 0
        log.info("learning rate for a global batch of %d: %g (%s rule from %g at %d), warm-up over %d steps",
                 self._global_batch, self.target_lr, self.rule.value, self.base_lr, self.reference_batch,
                 self._warmup_total)
        self._set(self._lr_at(self._step(0)))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def _step(self, batch: int) -> int:
        if self._steps_per_epoch:
            return self._epoch * self._steps_per_epoch + batch
        return self._seen

    def _lr_at(self, step: int) -> float:
        target = self.target_lr
        assert target is not None  # on_train_begin has read the global batch
        return warmup_lr(step, warmup_steps=self._warmup_total, start_lr=self.warmup_start_lr, target_lr=float(target))

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self._step(batch)
        self._seen += 1
        if step <= self._warmup_total:
            self._set(self._lr_at(step))


def check_callback_keras(callback: Any, model: Any, maker: str) -> None:
    """Refuses a callback of one Keras for a model of the other (``maker`` is what takes ``keras=model``)."""
    which = keras_of(model, type(callback).__name__)
    if which is not callback.keras:
        raise TypeError(f"{type(callback).__name__} is a {callback.keras.value} callback and fit's model is a "
                        f"{which.value} model. Received: model of type {type(model).__module__}."
                        f"{type(model).__qualname__}; pass keras=model to {maker}.")


@functools.cache
def _callback_class(which: Keras) -> type:
    base = keras_module(which).callbacks.Callback
    return type("LearningRateScaling", (_LearningRateScaling, base),
                {"__module__": __name__, "__doc__": _LearningRateScaling.__doc__,
                 "__qualname__": "LearningRateScaling", "keras": which})


def callback_class(keras: Keras | str | Any = None) -> type:
    """The learning-rate scaling callback class for one Keras (a subclass of its ``callbacks.Callback``).

    Args:
        keras: ``"keras3"``, ``"keras2"``, a Keras model (its Keras), or None for the Keras ``tf.keras`` is here.
    """
    return _callback_class(as_keras(keras, "large_batch.callback_class"))


def scaled_learning_rate(*, base_lr: float, reference_batch: int, global_batch: int | None = None,
                         per_replica_batch: int | None = None, strategy: Any = None,
                         rule: ScalingRule | str = "linear", warmup_epochs: int = 0, warmup_steps: int | None = None,
                         warmup_start_lr: float | None = None, keras: Keras | str | Any = None) -> Any:
    """A callback that sets the optimizer's learning rate for the global batch, with a linear warm-up.

    Args:
        base_lr: the learning rate that suits ``reference_batch`` (e.g. 0.1 at 256 for ResNet-50 in Goyal et al.).
        reference_batch: the global batch ``base_lr`` was tuned for.
        global_batch: examples per step over all replicas; or None and ``per_replica_batch``.
        per_replica_batch: examples per replica per step: the global batch is this x ``num_replicas_in_sync`` of
            ``strategy`` (by default the model's, read when training starts).
        strategy: the ``tf.distribute`` strategy whose replicas to count (with ``per_replica_batch`` only).
        rule: ``"linear"`` or ``"sqrt"`` (:class:`ScalingRule`).
        warmup_epochs: epochs of linear warm-up, per step (Goyal et al.: 5); 0 for none.
        warmup_steps: steps of warm-up instead of epochs (for a dataset of unknown length).
        warmup_start_lr: where the warm-up starts: ``base_lr`` by default.
        keras: the model that will ``fit`` (its Keras), ``"keras3"`` or ``"keras2"``; None for ``tf.keras``'s.

    Raises:
        ValueError: a rule other than linear/sqrt, a non-positive batch or learning rate, a negative warm-up,
            both or neither of ``global_batch``/``per_replica_batch``, both warm-up lengths.
        TypeError (when training starts): the optimizer's learning rate is a schedule, which cannot be set.

    Example:
        >>> import keras
        >>> cb = scaled_learning_rate(base_lr=0.1, reference_batch=32, global_batch=128, rule="sqrt", keras="keras3")
        >>> cb.target_lr
        0.2
    """
    return callback_class(keras)(base_lr=base_lr, reference_batch=reference_batch, global_batch=global_batch,
                                 per_replica_batch=per_replica_batch, strategy=strategy, rule=rule,
                                 warmup_epochs=warmup_epochs, warmup_steps=warmup_steps,
                                 warmup_start_lr=warmup_start_lr)


def parse_scale_lr(text: str, name: str = "scale_lr") -> tuple[ScalingRule, int]:
    """``"RULE:REFERENCE_BATCH"`` (``tensorfleet launch --scale-lr linear:64``): the rule, and the global batch the
    script's learning rate is for.

    Example:
        >>> parse_scale_lr("sqrt:64")
        (<ScalingRule.SQRT: 'sqrt'>, 64)
        >>> parse_scale_lr("linear")
        Traceback (most recent call last):
        ...
        ValueError: scale_lr must be RULE:REFERENCE_BATCH with RULE linear or sqrt and the global batch the learning
        rate is for, e.g. 'linear:64'. Received: scale_lr='linear'
    """
    rule, _, reference = str(text).strip().partition(":")
    if rule.strip().lower() not in {r.value for r in ScalingRule} or not reference.strip().isdigit() \
            or int(reference) < 1:
        raise ValueError(f"{name} must be RULE:REFERENCE_BATCH with RULE linear or sqrt and the global batch the "
                         f"learning rate is for, e.g. 'linear:64'. Received: {name}={text!r}")
    return ScalingRule(rule.strip().lower()), int(reference)


def scaled_learning_rate_for(scale_lr: str, *, model: Any, global_batch: int) -> Any:
    """The callback of ``scale_lr`` (``"RULE:REFERENCE_BATCH"``) for a compiled ``model`` training at
    ``global_batch``: its optimizer's learning rate now (the script's, before any backup is restored) is the
    base rate at the reference batch. A job restarted at another size builds it again with its new global
    batch (``keep_per_replica``), so the rate follows.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        >>> round(scaled_learning_rate_for("linear:64", model=model, global_batch=128).target_lr, 6)
        0.1
    """
    rule, reference = parse_scale_lr(scale_lr)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise TypeError("scale_lr reads the learning rate of a compiled model's optimizer. Received: a model "
                        "without an optimizer; compile it first.")
    check_settable(optimizer)
    base_lr = float(getattr(optimizer.learning_rate, "numpy", lambda: optimizer.learning_rate)())
    return scaled_learning_rate(base_lr=base_lr, reference_batch=reference, global_batch=global_batch, rule=rule,
                                keras=model)
