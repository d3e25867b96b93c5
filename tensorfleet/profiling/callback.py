"""The Keras callback that records chosen steps of ``fit`` (see :mod:`tensorfleet.profiling.recorder`), in
Keras 3 and tf_keras alike.

One callback class serves both Kerases: it is a tf_keras ``Callback``, whose protocol Keras 3's ``CallbackList``
calls as it calls its own (``set_model``, ``set_params`` and the ``on_*`` hooks), while tf_keras' list needs
its own class's private methods. Two things differ by Keras, and the callback does them itself:

* tf_keras' ``fit`` puts the ``train`` step annotation the analysis cuts steps by around every step; Keras
  3's TensorFlow trainer puts none, so for a Keras 3 model the callback annotates each recorded step, from
  its ``on_train_batch_begin`` to its ``on_train_batch_end`` (the step's ``train_function`` call), numbered
  within its epoch as tf_keras numbers them.
* tf_keras lets a callback switch its per-step hook dispatch off outside the recorded epochs; Keras 3's
  ``CallbackList`` has no such switch and calls the hooks every step (a Python call each).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tensorfleet.compat.keras import is_keras3_model, keras2, keras_of
from tensorfleet.compat.profiler import (
    callback_list_calling,
    cluster_coordinator,
    implements_train_batch_hooks,
    set_train_batch_hooks,
    step_trace,
)
from tensorfleet.profiling.recorder import STEP_NAME, Capture, StepRange, task_directory
from tensorfleet.validation import renamed

__all__ = ["ProfileCallback"]


class ProfileCallback(keras2().callbacks.Callback):  # type: ignore[misc]  # (tf_keras's, found at import)
    """Records steps ``steps`` of ``fit`` (counted from 0 across epochs) into ``out_dir/<task>``.

    The profiler starts as the step before the first chosen one ends and stops as the step after
    the last one begins (or at the end of the epoch or of training), so every chosen step is
    recorded whole, with the ``train`` annotation ``fit`` puts around it, and nothing else is.

    Keras 3 and tf_keras models alike (see the module). Outside the epochs that hold the chosen steps the
    callback costs nothing per step in tf_keras: Keras calls no batch hook for it there (unless another
    callback needs them anyway); Keras 3 calls them, and they return at once.

    Under a parameter-server strategy the workers and ps tasks are recorded too, each into its own
    ``out_dir/<role>-<index>`` (see :mod:`tensorfleet.profiling.remote`); the coordinator waits for the
    steps before the first chosen one, and pauses once after the last until those traces end.

    Example:
        >>> import tensorfleet as tfl
        >>> cb = tfl.profiling.ProfileCallback("profile/", steps="20-30")    # doctest: +SKIP
        >>> model.fit(dataset, epochs=3, callbacks=[cb])                     # doctest: +SKIP
    """

    @renamed(logdir="out_dir")
    def __init__(self, out_dir: str | os.PathLike[str], steps: Any, *, task: str | None = None) -> None:
        super().__init__()
        # Keras then passes its logs as tensors, as without callbacks, instead of fetching them every step.
        self._supports_tf_logs = True
        self.steps = StepRange.parse(steps)  # (always a range here: the capture's may be None elsewhere)
        self.capture = Capture(task_directory(out_dir, task), self.steps)
        self.seen = 0  # batches of this fit finished so far: the number of the next step
        self._epochs = 0
        self._epoch_base = 0  # steps done before this epoch
        self._owner: Any = None
        self._annotate = False  # a Keras 3 fit, whose steps this callback annotates itself
        self._trace: Any = None  # the open annotation of the step running now

    def set_model(self, model: Any) -> None:
        """Keras hands the model being fitted here (a Keras 3 or a tf_keras model).

        Raises:
            TypeError: ``model`` is not a Keras model.
        """
        keras_of(model, "tfl.profiling.ProfileCallback")
        super().set_model(model)
        self._annotate = is_keras3_model(model)

    @property
    def directory(self) -> Path:
        return self.capture.directory

    def _stop_if_past(self) -> None:
        if self.capture.running and self.seen > self.steps.last:
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
        if self.steps.first == 0:
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
        first, last = self.steps.first - 1, self.steps.last + 1
        return self._batch_hooks(self.seen <= last and self.seen + per_epoch > first)

    def _end_step(self) -> None:
        if self._trace is not None:
            trace, self._trace = self._trace, None
            trace.__exit__(None, None, None)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._stop_if_past()
        if self._annotate and self.capture.running:
            self._trace = step_trace(STEP_NAME, batch)
            self._trace.__enter__()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._end_step()
        # ``batch`` is the epoch's last step done: with steps_per_execution > 1 Keras runs several per call.
        stride = self._epoch_base + batch + 1 - self.seen
        self.seen += stride
        self.capture.mark(self.seen)
        steps = self.steps
        if not self.capture.running and self.seen <= steps.last and steps.first < self.seen + stride:
            self.capture.start()  # inside the previous call's annotation, which is therefore not recorded

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._end_step()
        per_epoch = (self.params or {}).get("steps")
        if per_epoch:  # counted here too when Keras called no batch hook this epoch
            self.seen = self._epochs * per_epoch
        self._stop_if_past()

    def on_train_end(self, logs: Any = None) -> None:
        self._end_step()
        self.capture.stop()
        self._batch_hooks(True)
        self._owner = None
