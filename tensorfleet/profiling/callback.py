"""The Keras callback that records chosen steps of ``fit`` (see :mod:`tensorfleet.profiling.recorder`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


from tensorfleet.compat.profiler import (callback_list_calling, cluster_coordinator, implements_train_batch_hooks,
                                         set_train_batch_hooks)
from tensorfleet.profiling.recorder import Capture, StepRange, task_directory
from tensorfleet.compat.keras import keras2

__all__ = ["ProfileCallback"]


class ProfileCallback(keras2().callbacks.Callback):
    """Records steps ``steps`` of ``fit`` (counted from 0 across epochs) into ``logdir/<task>``.

    The profiler starts as the step before the first chosen one ends and stops as the step after
    the last one begins (or at the end of the epoch or of training), so every chosen step is
    recorded whole, with the ``train`` annotation ``fit`` puts around it, and nothing else is.

    Outside the epochs that hold the chosen steps the callback costs nothing per step: Keras calls
    no batch hook for it there (unless another callback needs them anyway).

    Under a parameter-server strategy the workers and ps tasks are recorded too, each into its own
    ``logdir/<role>-<index>`` (see :mod:`tensorfleet.profiling.remote`); the coordinator waits for the
    steps before the first chosen one, and pauses once after the last until those traces end.

    Example:
        >>> import tensorfleet as tfl
        >>> cb = tfl.profiling.ProfileCallback("profile/", steps="20-30")    # doctest: +SKIP
        >>> model.fit(dataset, epochs=3, callbacks=[cb])                     # doctest: +SKIP
    """

    def __init__(self, logdir: str | os.PathLike[str], steps: Any, *, task: str | None = None) -> None:
        super().__init__()
        # Keras then passes its logs as tensors, as without callbacks, instead of fetching them every step.
        self._supports_tf_logs = True
        self.capture = Capture(task_directory(logdir, task), StepRange.parse(steps))
        self.seen = 0  # batches of this fit finished so far: the number of the next step
        self._epochs = 0
        self._epoch_base = 0  # steps done before this epoch
        self._owner: Any = None

    def set_model(self, model: Any) -> None:
        """Keras hands the model being fitted here; only Keras 2 (tf_keras) models are recorded.

        Raises:
            tensorfleet.compat.keras.Keras3ModelError: ``fit`` of a Keras 3 model was given this callback.
        """
        from tensorfleet.compat.keras import require_keras2

        super().set_model(require_keras2(model, "tfl.profiling.ProfileCallback"))

    @property
    def directory(self) -> Path:
        return self.capture.directory

    def _stop_if_past(self) -> None:
        if self.capture.running and self.seen > self.capture.steps.last:
            self.capture.stop()

    def _batch_hooks(self, needed: bool) -> None:
        """Lets Keras skip its per-step hook dispatch when neither this callback nor another needs it."""
        owner = self._owner
        if owner is not None:
            others = any(c is not self and implements_train_batch_hooks(c) for c in owner.callbacks)
            set_train_batch_hooks(owner, needed or others)

    def on_train_begin(self, logs: Any = None) -> None:
        self.seen = self._epoch_base = self._epochs = 0
        self._owner = callback_list_calling(self)
        coordinator = cluster_coordinator(self.model)  # set by fit under a parameter server
        if coordinator is not None:
            self.capture.coordinate(coordinator)
        if self.capture.steps.first == 0:
            self.capture.start()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        per_epoch = (self.params or {}).get("steps")
        if not per_epoch:
            self._epoch_base = self.seen
            return self._batch_hooks(True)
        self.seen = self._epoch_base = self._epochs * per_epoch
        self._epochs += 1
        self.capture.mark(self.seen)
        # The profiler starts at the end of the step before the first chosen one and stops at the
        # beginning of the one after the last: those steps' epochs need the hooks, no other does.
        first, last = self.capture.steps.first - 1, self.capture.steps.last + 1
        return self._batch_hooks(self.seen <= last and self.seen + per_epoch > first)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._stop_if_past()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # ``batch`` is the epoch's last step done: with steps_per_execution > 1 Keras runs several per call.
        stride = self._epoch_base + batch + 1 - self.seen
        self.seen += stride
        self.capture.mark(self.seen)
        steps = self.capture.steps
        if not self.capture.running and self.seen <= steps.last and steps.first < self.seen + stride:
            self.capture.start()  # inside the previous call's annotation, which is therefore not recorded

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        per_epoch = (self.params or {}).get("steps")
        if per_epoch:  # counted here too when Keras called no batch hook this epoch
            self.seen = self._epochs * per_epoch
        self._stop_if_past()

    def on_train_end(self, logs: Any = None) -> None:
        self.capture.stop()
        self._batch_hooks(True)
        self._owner = None
