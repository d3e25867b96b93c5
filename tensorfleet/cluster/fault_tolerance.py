"""Fault tolerance for Keras ``fit`` under a distribution strategy, in one call.

:func:`callbacks` returns the callbacks a job needs to survive a worker being killed:

* ``tf.keras.callbacks.BackupAndRestore`` on a backup directory every worker of the job
  agrees on (:func:`backup_dir`): Keras itself writes the chief's backup there and lets the
  other workers write to their own temporary sub-directories, so the path must be the same
  string on every worker. Backups are per epoch or every ``save_freq`` steps.
* :class:`BestModelCheckpoint`: the best model so far by a monitored metric, written
  atomically (saved to a temporary file on every worker, then moved into place by the chief
  only), so a kill mid-write never leaves a half-written model behind.
* :class:`EpochLog`: one line per epoch (and optionally per step) such as
  ``tensorfleet: resumed from backup at epoch 3``, which shows in the launcher's log where a
  restarted job picked up.

A restarted job that runs the same script resumes from the last backup: with op
determinism on, fixed seeds and an input pipeline that yields the same batches for an epoch
whenever it starts (``tfl.strategies.fit_inputs(..., strategy=model)`` shuffles each epoch by its
seed and the optimizer's step count, which the backup restores), the resumed run ends with the
weights of an uninterrupted one.

The callbacks are those of the model's Keras: ``callbacks(keras=model)`` (or ``keras="keras3"``;
by default the Keras ``tf.keras`` is in this process). A Keras 3 model gets a subclass of
``keras.callbacks.BackupAndRestore`` made for several workers
(:func:`tensorfleet.compat.keras3_checkpoints.backup_and_restore`: Keras 3's own has every worker write the
one shared file) and Keras 3 classes of the callbacks below; it backs up per epoch only, since
Keras 3 restores the epoch but not the step within it. Each class exists once per Keras, made on
first use (:func:`callback_class`); the names of this module (``EpochLog`` ...) are those of the
process's Keras.

Example:
    >>> from tensorfleet.cluster import fault_tolerance
    >>> cbs = fault_tolerance.callbacks(best_model="out/best.keras")  # doctest: +SKIP
    >>> model.fit(dataset, epochs=6, callbacks=cbs)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from tensorfleet.cluster.contract import (
    ENV_BACKUP_DIR,
    ENV_SCALE_LR,
    ENV_STOP_AFTER_EPOCH,
    EPOCH_BEGIN,
    EPOCH_END,
    EPOCH_STEP,
    RESUMED_FROM_BACKUP,
    STOPPED_STATUS,
    STOPPING_AFTER_EPOCH,
)
from tensorfleet.compat.keras import Keras, as_keras, keras_module, keras_of
from tensorfleet.io import write_bytes, write_json
from tensorfleet.validation import positive_int

# The callback classes of the process's Keras, made on first use by the module's __getattr__.
_CALLBACK_NAMES = ("BackupCleanup", "BestModelCheckpoint", "EpochLog", "StepLog", "StopAfterEpoch")

__all__ = [*_CALLBACK_NAMES, "backup_dir", "callback_class", "callbacks", "resumed_epoch"]

def backup_dir(base: str | os.PathLike[str] | None = None, *,
               environ: Mapping[str, str] | None = None) -> Path:
    """The backup directory shared by all workers of this job.

    ``base`` when given; else ``$TENSORFLEET_BACKUP_DIR`` (the launcher and the Kubernetes
    TFJob set it, the latter to a mounted volume); else a directory under the system
    temporary directory named after the job's cluster in TF_CONFIG, so that every process of
    one local job gets the same path and two jobs never share one.

    Example:
        >>> backup_dir("/tmp/run1")
        PosixPath('/tmp/run1')
    """
    env = os.environ if environ is None else environ
    if base is None:
        base = env.get(ENV_BACKUP_DIR) or None
    if base is not None:
        if not str(base).strip():
            raise ValueError(f"backup_dir must be a non-empty path. Received: backup_dir={str(base)!r}")
        return Path(base)
    cluster = ""
    raw = env.get("TF_CONFIG", "")
    if raw.strip():
        from tensorfleet.strategies.tf_config import parse_tf_config

        cluster = json.dumps(parse_tf_config(raw).cluster.as_dict(), sort_keys=True)
    digest = hashlib.sha1(cluster.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "tensorfleet-backup" / digest


def _default_backup(base: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether :func:`backup_dir` picks the directory itself (under the temporary directory)."""
    env = os.environ if environ is None else environ
    return base is None and not env.get(ENV_BACKUP_DIR)


class _OfOneKeras:
    """What every callback here shares: it is made for one Keras (``keras``) and says so when handed a model of
    the other, instead of failing later somewhere inside that Keras."""

    keras: Keras
    model: Any  # what the Keras Callback this is mixed into sets (annotations only: nothing set here)
    params: dict[str, Any]

    def set_model(self, model: Any) -> None:
        which = keras_of(model, type(self).__name__)
        if which is not self.keras:
            raise TypeError(f"{type(self).__name__} is a {self.keras.value} callback and fit's model is a "
                            f"{which.value} model. Received: model of type "
                            f"{type(model).__module__}.{type(model).__qualname__}; "
                            "pass keras=model to tensorfleet.cluster.fault_tolerance.callbacks (or "
                            "callback_class(name, model)) for callbacks of the model's Keras.")
        super().set_model(model)  # type: ignore[misc]


class _BackupCleanup(_OfOneKeras):
    """Removes the backup directory tensorfleet chose, once ``fit`` has ended successfully.

    ``BackupAndRestore`` deletes its files when ``fit`` ends but leaves the directory; a run
    that used :func:`backup_dir`'s default (under the temporary directory) would leave an empty
    ``tensorfleet-backup/<job>`` behind every time. Only empty directories are removed, so
    another worker's files still being cleaned up, or anything else put there, stay; a
    directory the user named is never touched (``callbacks`` adds this only for the default).
    A failed or stopped run does not reach ``on_train_end``: its backup stays for the restart.
    Must come after ``BackupAndRestore``.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__()
        self.directory = Path(directory)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        for path in (self.directory, self.directory.parent):
            try:
                path.rmdir()
            except FileNotFoundError:  # already gone
                continue
            except OSError:  # not empty (another worker's, or not ours)
                return


def _should_write(model: Any) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    return bool(strategy is None or strategy.extended.should_checkpoint)


class _EpochLog(_OfOneKeras):
    """Prints ``tensorfleet: epoch E/N begin|end ...`` lines and where a run resumed.

    The lines are for people and for the launcher's ``faults``/``stop_when`` patterns. It has
    no batch hooks, so it also works under ``ParameterServerStrategy``; :class:`StepLog` adds
    a line per step.
    """

    def __init__(self, *, stream: Any = None) -> None:
        super().__init__()
        self.stream = stream
        self._first = True
        self._epoch = 0
        self._epochs = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._epochs = int(self.params.get("epochs") or 0)
        self._first = True

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch + 1
        if self._first and epoch > 0:
            RESUMED_FROM_BACKUP.say(epoch=epoch + 1, stream=self.stream)
        self._first = False
        EPOCH_BEGIN.say(epoch=epoch + 1, epochs=self._epochs, stream=self.stream)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        metrics = "".join(f" {k}={float(v):.6f}" for k, v in sorted((logs or {}).items()))
        EPOCH_END.say(epoch=epoch + 1, epochs=self._epochs, metrics=metrics, stream=self.stream)


class _StepLog(_EpochLog):
    """:class:`EpochLog` plus ``tensorfleet: epoch E step S`` after every training step."""

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        EPOCH_STEP.say(epoch=self._epoch, step=batch + 1, stream=self.stream)


class _BestModelCheckpoint(_OfOneKeras):
    """Keeps the best model so far (``.keras`` file), written atomically by the chief.

    Every worker saves (saving may read synchronised variables, which is a collective in
    multi-worker jobs) to its own temporary directory; only the chief moves the bytes into
    ``filepath``, through :func:`tensorfleet.io.write_bytes`, with a JSON sidecar
    (``<filepath>.json``: epoch, monitor, value) that also carries the best value across a
    restart.
    """

    def __init__(self, filepath: str | os.PathLike[str], *, monitor: str = "val_loss", mode: str = "min") -> None:
        super().__init__()
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max'. Received: mode={mode!r}")
        path = Path(filepath)
        if path.suffix != ".keras":
            raise ValueError(f"filepath must end in '.keras'. Received: filepath={str(filepath)!r}")
        self.filepath = path
        self.sidecar = path.with_name(path.name + ".json")
        self.monitor = monitor
        self.mode = mode
        self.best: float | None = None
        self.best_epoch: int | None = None

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.sidecar.exists():  # a restarted job must not overwrite a better model
            record = json.loads(self.sidecar.read_text())
            if record.get("monitor") == self.monitor:
                self.best, self.best_epoch = float(record["value"]), int(record["epoch"])

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        if self.monitor not in logs:
            raise KeyError(
                f"BestModelCheckpoint monitors {self.monitor!r}, which fit did not log. "
                f"Logged: {sorted(logs)}. Pass monitor= one of those (val_* needs validation_data)."
            )
        value = float(logs[self.monitor])
        if math.isnan(value) or not self._better(value):
            return
        self.best, self.best_epoch = value, epoch + 1
        scratch = Path(tempfile.mkdtemp(prefix="tensorfleet-best-"))
        try:
            local = scratch / self.filepath.name
            self.model.save(local)
            if _should_write(self.model):
                write_bytes(self.filepath, local.read_bytes())
                write_json(self.sidecar, {"epoch": epoch + 1, "monitor": self.monitor, "value": value})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class _StopAfterEpoch(_OfOneKeras):
    """Ends the process right after epoch ``epoch`` was backed up, as a preempted job would.

    The process exits with :data:`~tensorfleet.cluster.contract.STOPPED_STATUS` (75, the
    launcher's planned stop) without returning from
    ``fit``, so ``BackupAndRestore`` keeps its backup (it deletes it when ``fit`` ends) and
    the next run resumes at ``epoch + 1``. Must come after ``BackupAndRestore``.
    """

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = positive_int("epoch", epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch + 1 == self.epoch:
            STOPPING_AFTER_EPOCH.say(epoch=self.epoch)
            sys.stderr.flush()
            os._exit(STOPPED_STATUS)


_BEHAVIOURS: dict[str, type] = {"BackupCleanup": _BackupCleanup, "BestModelCheckpoint": _BestModelCheckpoint,
                                 "EpochLog": _EpochLog, "StepLog": _StepLog, "StopAfterEpoch": _StopAfterEpoch}


@functools.cache
def _callback_class(name: str, which: Keras) -> type:
    behaviour = _BEHAVIOURS[name]
    # StepLog is an EpochLog of the same Keras, as it was when there was one Keras.
    base = _callback_class("EpochLog", which) if name == "StepLog" else keras_module(which).callbacks.Callback
    return type(name, (behaviour, base), {"__module__": __name__, "__doc__": behaviour.__doc__,
                                          "__qualname__": name, "keras": which})


def callback_class(name: str, keras: Keras | str | Any = None) -> type:
    """The callback class ``name`` of this module for one Keras, made on its first use.

    Args:
        name: ``"BackupCleanup"``, ``"BestModelCheckpoint"``, ``"EpochLog"``, ``"StepLog"`` or ``"StopAfterEpoch"``.
        keras: ``"keras3"``, ``"keras2"``, a Keras model (its Keras), or None for the Keras ``tf.keras`` is here.

    Raises:
        ValueError: an unknown ``name`` or Keras name (the message lists the accepted ones).
        TypeError: ``keras`` is an object of no Keras.

    Example:
        >>> import keras
        >>> issubclass(callback_class("EpochLog", "keras3"), keras.callbacks.Callback)
        True
    """
    if name not in _BEHAVIOURS:
        raise ValueError(f"name must be one of {sorted(_BEHAVIOURS)}. Received: name={name!r}")
    return _callback_class(name, as_keras(keras, "fault_tolerance.callback_class"))


def __getattr__(name: str) -> type:
    # EpochLog, StepLog, ... are the classes of this process's Keras, made when first asked for, so that
    # importing this module imports neither Keras.
    if name in _BEHAVIOURS:
        return _callback_class(name, as_keras(None))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backup_and_restore(which: Keras, directory: Path, save_freq: str | int) -> Any:
    if which is Keras.KERAS2:
        return keras_module(which).callbacks.BackupAndRestore(str(directory), save_freq=save_freq)
    if save_freq != "epoch":
        raise ValueError("save_freq must be 'epoch' for a Keras 3 model: Keras 3's BackupAndRestore restores the "
                         "epoch a backup was made in but not the step, so a resumed run would repeat that epoch's "
                         f"first steps on weights that already learned from them. Received: save_freq={save_freq!r}")
    from tensorfleet.compat.keras3_checkpoints import backup_and_restore

    return backup_and_restore(str(directory), save_freq=save_freq)


def _scaled_learning_rate(scale_lr: str, model: Any, global_batch_size: int | None) -> Any:
    from tensorfleet.strategies.large_batch import scaled_learning_rate_for

    if global_batch_size is None or isinstance(model, (str, Keras)) or model is None:
        raise ValueError(f"{ENV_SCALE_LR}={scale_lr!r} (launch --scale-lr) scales the learning rate for the global "
                         "batch: fault_tolerance.callbacks needs global_batch_size= and keras=the compiled model. "
                         f"Received: global_batch_size={global_batch_size!r}, keras={model!r}")
    return scaled_learning_rate_for(scale_lr, model=model, global_batch=global_batch_size)


def callbacks(
    backup: str | os.PathLike[str] | None = None,
    *,
    save_freq: str | int = "epoch",
    best_model: str | os.PathLike[str] | None = None,
    monitor: str = "val_loss",
    mode: str = "min",
    log: bool = True,
    log_steps: bool = False,
    keras: Keras | str | Any = None,
    global_batch_size: int | None = None,
) -> list[Any]:
    """The fault-tolerance callbacks for ``model.fit``, in the order they must run.

    Args:
        backup: the backup directory (see :func:`backup_dir` for the default).
        save_freq: ``"epoch"`` or a positive number of steps between backups.
        best_model: where to keep the best model (``.keras``); ``None`` for none.
        monitor: the logged metric that decides "best".
        mode: ``"min"`` or ``"max"`` for ``monitor``.
        log: add :class:`EpochLog` (last, so a line saying an epoch ended comes after its backup).
        log_steps: log with :class:`StepLog` (a line per step too) instead of :class:`EpochLog`.
        keras: the Keras whose callbacks these are: the model that will ``fit`` (its Keras), ``"keras3"`` or
            ``"keras2"``; None for the Keras ``tf.keras`` is in this process. A Keras 3 model's
            ``save_freq`` must be ``"epoch"``.
        global_batch_size: the global batch of this run; with ``$TENSORFLEET_SCALE_LR`` (``launch --scale-lr
            RULE:REFERENCE``) a learning-rate callback for it is added (keras= must then be the compiled model):
            an elastic restart at another size builds it again, so the rate follows the global batch.

    Returns:
        ``[BackupAndRestore, LearningRateScaling?, BackupCleanup?, BestModelCheckpoint?, EpochLog?,
        StopAfterEpoch?]``; the learning rate after the backup is restored, when ``$TENSORFLEET_SCALE_LR`` is set;
        :class:`BackupCleanup` when the backup directory is the default one (neither ``backup``
        nor ``$TENSORFLEET_BACKUP_DIR``), the last when ``$TENSORFLEET_STOP_AFTER_EPOCH`` is set
        (elastic phases set it).

    Example:
        >>> cbs = callbacks("/tmp/backup", save_freq=50, best_model="/tmp/best.keras")  # doctest: +SKIP
    """
    if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq <= 0):
        raise ValueError(f"save_freq must be 'epoch' or a positive number of steps. Received: save_freq={save_freq!r}")
    which = as_keras(keras, "fault_tolerance.callbacks")
    directory = backup_dir(backup)
    result: list[Any] = [_backup_and_restore(which, directory, save_freq)]
    if _default_backup(backup):
        result.append(_callback_class("BackupCleanup", which)(directory))
    if best_model is not None:
        result.append(_callback_class("BestModelCheckpoint", which)(best_model, monitor=monitor, mode=mode))
    if log:
        result.append(_callback_class("StepLog" if log_steps else "EpochLog", which)())
    scale_lr = os.environ.get(ENV_SCALE_LR, "").strip()
    if scale_lr:
        result.insert(1, _scaled_learning_rate(scale_lr, keras, global_batch_size))
    stop_after = os.environ.get(ENV_STOP_AFTER_EPOCH, "").strip()
    if stop_after:
        if not stop_after.isdigit():
            raise ValueError(f"{ENV_STOP_AFTER_EPOCH} must be a positive integer. Received: {stop_after!r}")
        result.append(_callback_class("StopAfterEpoch", which)(int(stop_after)))
    return result


def resumed_epoch(lines: list[str]) -> int | None:
    """The epoch a run resumed at, read from its :class:`EpochLog` output (None: fresh start).

    Example:
        >>> resumed_epoch(["tensorfleet: resumed from backup at epoch 3"])
        3
    """
    for line in lines:
        found = RESUMED_FROM_BACKUP.read(line)
        if found is not None:
            return found["epoch"]
    return None
