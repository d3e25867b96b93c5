"""The Keras callback that records chosen steps of ``fit`` (see :mod:`tensorfleet.profiling.recorder`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tensorflow as tf

from tensorfleet.profiling.recorder import Capture, StepRange, task_directory

__all__ = ["ProfileCallback"]


class ProfileCallback(tf.keras.callbacks.Callback):
    """Records steps ``steps`` of ``fit`` (counted from 0 across epochs) into ``logdir/<task>``.

    The profiler starts as the step before the first chosen one ends and stops as the step after
    the last one begins (or at the end of the epoch or of training), so every chosen step is
    recorded whole, with the ``train`` annotation ``fit`` puts around it, and nothing else is.

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

    @property
    def directory(self) -> Path:
        return self.capture.directory

    def _stop_if_past(self) -> None:
        if self.capture.running and self.seen > self.capture.steps.last:
            self.capture.stop()

    def on_train_begin(self, logs: Any = None) -> None:
        self.seen = 0
        if self.capture.steps.first == 0:
            self.capture.start()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._stop_if_past()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        if self.seen == self.capture.steps.first:
            self.capture.start()  # inside the previous step's annotation, which is therefore not recorded

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._stop_if_past()

    def on_train_end(self, logs: Any = None) -> None:
        self.capture.stop()
