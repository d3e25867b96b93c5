"""Keras 3's callbacks that write files, for multi-worker jobs: each worker saves (saving reads sync-on-read
variables, a collective every worker joins), only the chief's file lands where the user asked.

* ``BackupAndRestore``: Keras 3's own has every worker write ``latest.weights.h5`` into the one shared directory at
  once, delete it at the end while another may still write, and a kill between its two files leaves weights of
  one epoch beside the epoch count of another. :func:`backup_and_restore` returns a subclass that writes only the
  chief's backup (the other workers save to a scratch directory), each file atomically, the metadata naming the
  weights file it belongs to.
* ``ModelCheckpoint`` (``keras.callbacks.ModelCheckpoint``, the user's own): Keras 3.15's writes the same file from
  every worker at once (tf_keras sends the other workers' copies to a temporary folder; Keras 3 lost that).
  :func:`mend_model_checkpoint` (installed by :func:`tensorfleet.compat.keras3.mend_fit`) makes a non-chief worker
  save into a scratch folder of its own, removed after each save; the chief's save is Keras' own. One process (no
  strategy, or one worker) is the chief; of a mesh across processes (DTensor's clients) the first process is,
  the others gather every value with it and write nothing.

Example:
    >>> from tensorfleet.compat import keras3_checkpoints
    >>> isinstance(keras3_checkpoints.model_checkpoint_mended(), bool)
    True
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from typing import Any, Callable

__all__ = ["backup_and_restore", "mend_model_checkpoint", "model_checkpoint_mended", "restore_model_checkpoint",
           "seed_generators"]

_original: dict[str, Any] = {}
"""Keras 3's own ``ModelCheckpoint._save_model``, while the mend is installed."""



def _is_chief(model: Any) -> bool:
    """The worker whose files land: the chief of a strategy; of a mesh across processes, its first process."""
    from tensorfleet.compat.dtensor import other_client

    strategy = getattr(model, "distribute_strategy", None)
    return bool(strategy is None or strategy.extended.should_checkpoint) and not other_client()


def _read_metadata(path: str) -> dict[str, Any] | None:
    """A backup's training metadata; None for a fresh start (a weights file without its metadata is an unfinished
    save)."""
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def _load_backup_weights(model: Any, path: str) -> None:
    """Loads a backup's weights into ``model``, building its optimizer first (the file holds its variables)."""
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(path)


def _backup_weights(directory: str) -> set[str]:
    """The names of the backup's weights files in ``directory``."""
    return {entry for entry in os.listdir(directory) if entry.startswith("backup-") and entry.endswith(".weights.h5")}


def _publish_backup(directory: str, partial: str, name: str, metadata_path: str, metadata: dict[str, Any]) -> None:
    """Makes the chief's saved ``partial`` the backup: moved to ``name``, then the metadata naming it written, then
    the older weights files removed (a kill at any point leaves metadata and the weights it names)."""
    from tensorfleet.io import write_json

    os.replace(partial, os.path.join(directory, name))
    previous = _backup_weights(directory)
    write_json(metadata_path, metadata)
    for old in previous - {name}:
        os.remove(os.path.join(directory, old))


def _remove_existing(directory: str, names: set[str]) -> None:
    for name in names:
        if os.path.exists(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))


@functools.cache
def _backup_class() -> type:
    import keras

    class BackupAndRestore(keras.callbacks.BackupAndRestore):
        """Keras 3's ``BackupAndRestore`` for multi-worker jobs and kills: only the chief writes the shared
        backup, each file atomically, and ``training_metadata.json`` names the weights file it goes with."""

        def __init__(self, backup_dir: str, save_freq: str | int = "epoch") -> None:
            super().__init__(backup_dir, save_freq=save_freq)
            self._generation = 0

        def _load_model(self) -> None:
            metadata = _read_metadata(self._training_metadata_path)
            if metadata is None:
                return
            _load_backup_weights(self.model, os.path.join(self.backup_dir, metadata["weights"]))
            self.model._initial_epoch = int(metadata["epoch"])
            self._generation = int(metadata.get("generation", 0))

        def _save_model(self) -> None:
            chief = _is_chief(self.model)
            directory = self.backup_dir if chief else tempfile.mkdtemp(prefix="tensorfleet-backup-worker-")
            try:
                os.makedirs(directory, exist_ok=True)
                self._generation += 1
                name = f"backup-{self._generation}.weights.h5"
                partial = os.path.join(directory, f"partial-{os.getpid()}.weights.h5")
                # Every worker saves: reading a sync-on-read variable is a collective all of them join.
                self.model.save_weights(partial, overwrite=True)
                if chief:
                    _publish_backup(directory, partial, name, self._training_metadata_path,
                                    {"epoch": self._current_epoch, "batch": self._last_batch_seen, "weights": name,
                                     "generation": self._generation})
            finally:
                if not chief:
                    shutil.rmtree(directory, ignore_errors=True)

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            # Only the chief wrote here, and the others may end before its last save. As Keras 2's does, this
            # removes the backup's files, not the directory (which may be one the user named).
            if not _is_chief(self.model) or not os.path.isdir(self.backup_dir):
                return
            _remove_existing(self.backup_dir,
                             _backup_weights(self.backup_dir) | {os.path.basename(self._training_metadata_path)})

    BackupAndRestore.__module__ = __name__
    return BackupAndRestore


def backup_and_restore(backup_dir: str, *, save_freq: str | int = "epoch") -> Any:
    """A Keras 3 ``keras.callbacks.BackupAndRestore`` (a subclass) that multi-worker jobs can share a directory
    with, and a kill at any moment leaves a backup that restores (see the module's docstring)."""
    return _backup_class()(backup_dir, save_freq=save_freq)


def _mended_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _save_model(self: Any, epoch: int, batch: Any, logs: Any) -> Any:
        if _is_chief(self.model):
            return original(self, epoch, batch, logs)
        scratch = tempfile.mkdtemp(prefix="tensorfleet-checkpoint-worker-")
        path_of = self._get_file_path  # the user's file name, placeholders filled, in the scratch folder
        self._get_file_path = lambda *args: os.path.join(scratch, os.path.basename(path_of(*args)))
        try:
            return original(self, epoch, batch, logs)
        finally:
            del self._get_file_path
            shutil.rmtree(scratch, ignore_errors=True)

    _save_model.tensorfleet_mend = True  # type: ignore[attr-defined]
    return _save_model


def model_checkpoint_mended() -> bool:
    """Whether :func:`mend_model_checkpoint` is installed in this process."""
    return bool(_original)


def mend_model_checkpoint() -> None:
    """Sends a non-chief worker's ``keras.callbacks.ModelCheckpoint`` saves to a scratch folder (see the module).
    Idempotent; call it only where Keras 3 is in use (:func:`tensorfleet.compat.keras3.mend_fit` does)."""
    if _original:
        return
    import keras

    _original["_save_model"] = keras.callbacks.ModelCheckpoint.__dict__["_save_model"]
    keras.callbacks.ModelCheckpoint._save_model = _mended_save(_original["_save_model"])


def restore_model_checkpoint() -> None:
    """Puts Keras 3's own ``ModelCheckpoint._save_model`` back (a no-op when nothing was mended)."""
    if _original:
        import keras

        keras.callbacks.ModelCheckpoint._save_model = _original.pop("_save_model")


def seed_generators(model: Any) -> list[Any]:
    """The ``SeedGenerator`` of every layer of a Keras 3 ``model`` (Dropout, GaussianNoise, the random augmentation
    layers ...), in the layers' order; each one's state is ``generator.state``, a Keras variable."""
    return [generator for layer in model._flatten_layers(include_self=True, recursive=True)
            for generator in layer._seed_generators]
