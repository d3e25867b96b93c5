"""A job's checkpoint that any strategy and any world size can continue from.

A migration checkpoint is a directory of numbered checkpoints (``step-00000012/``) and one
pointer, ``latest.json``, that names the newest complete one. Each numbered checkpoint holds
the ``tf.train.Checkpoint`` of the model's weights, the optimizer (its slots and its step
count, so Adam's moments and bias correction continue) and the count of every example id the
job has trained on, beside ``state.json``: the step, the epoch, the position in the epoch's
order (in examples, so that it means the same at every batch size), the random generator's
state that decides that order, the global batch policy and a fingerprint of the model.

Variables are saved without their placement, so a checkpoint written by two mirrored
replicas restores on a parameter server's variables or on one device. A checkpoint is
written to a temporary directory and renamed into place, and ``latest.json`` is replaced
atomically after it: a process killed at any moment leaves the previous checkpoint named
and intact.

Example:
    >>> state = JobProgress(step=12, epoch=1, epochs=3, position=32, seed=0, rng=new_rng_state(0), examples=96,
    ...                  global_batch_size=8, policy="keep_global", fingerprint="ab12", parameters=10,
    ...                  strategy="mirrored", replicas=2)
    >>> JobProgress.from_dict(state.as_dict()) == state
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tensorfleet.io import write_json
from tensorfleet.validation import renamed

__all__ = ["LATEST", "CheckpointError", "JobProgress", "check_same_keras", "epoch_order", "fingerprint", "latest",
           "new_rng_state", "read_state", "seed_job", "step_directory"]

#: The pointer to the newest complete checkpoint of a migration directory.
LATEST = "latest.json"
_STATE = "state.json"
_CKPT = "ckpt"


class CheckpointError(ValueError):
    """A migration checkpoint is missing, incomplete or belongs to another job."""


@dataclass(frozen=True)
class JobProgress:
    """Where a job is: everything besides the variables that a continuation needs."""

    step: int
    epoch: int
    epochs: int
    position: int
    seed: int
    rng: dict[str, Any]
    examples: int
    global_batch_size: int
    policy: str
    fingerprint: str
    parameters: int
    strategy: str
    replicas: int
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The Keras the job's model is written in (:class:`~tensorfleet.compat.keras.Keras`); its variables are
    #: named by that Keras in the checkpoint, so a checkpoint continues in the same Keras only. Checkpoints
    #: written before Keras 3 jobs existed lack it: they are tf_keras jobs'.
    keras: str = "keras2"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobProgress:
        return cls(**data)


def new_rng_state(seed: int) -> dict[str, Any]:
    """The state of the generator (numpy's PCG64) that orders the first epoch of a job seeded ``seed``."""
    import numpy as np

    return dict(np.random.Generator(np.random.PCG64(seed)).bit_generator.state)


def epoch_order(rng: dict[str, Any], examples: int) -> tuple[Any, dict[str, Any]]:
    """The epoch's order of example ids from the generator state ``rng``, and the state after it.

    The state saved with a checkpoint is the one the epoch began with, so a job continued in the
    middle of an epoch draws the same order again and skips what it has read.
    """
    import numpy as np

    generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = rng
    order = generator.permutation(examples)
    return order, dict(generator.bit_generator.state)


def seed_job(seed: int) -> None:
    """Seeds Python, numpy and TensorFlow, and tf_keras's own generator when it is installed.

    A Keras 3 model's initializers and seed generators draw their seeds from Python's ``random``
    when none is given, so the job's Keras 3 model is seeded by that too; Keras 3 itself is also
    seeded when the job already imported it (importing it only to seed would cost a Keras 2 job
    1.5 s at every start).
    """
    import random
    import sys

    import numpy as np
    import tensorflow as tf

    from tensorfleet.compat.keras import keras2

    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    try:
        keras2().utils.set_random_seed(seed)
    except ImportError:  # a Keras 3 installation without tf_keras
        pass
    loaded = sys.modules.get("keras")
    if loaded is not None and str(getattr(loaded, "__version__", "")).startswith("3."):
        loaded.utils.set_random_seed(seed)


def fingerprint(model: Any) -> str:
    """A short digest of a model's kind: its class and its weights' shapes and dtypes, in order.

    Two models with the same fingerprint can restore each other's checkpoints; one with another
    layer, width or dtype cannot.
    """
    # A Keras 3 variable's dtype is its name (a str), a tf_keras one's a tf.DType.
    parts = [type(model).__name__] + [f"{tuple(w.shape)}:{getattr(w.dtype, 'name', w.dtype)}" for w in model.weights]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@renamed(directory="out_dir")
def check_same_keras(state: JobProgress, model: Any, out_dir: str | os.PathLike[str]) -> None:
    """Refuses to continue ``state`` with a model of the other Keras: Keras 3 and tf_keras name a model's and an
    optimizer's variables differently in a checkpoint, so neither restores the other's.

    Raises:
        CheckpointError: the checkpoint was written by a job in the other Keras (the message names both).
    """
    from tensorfleet.compat.keras import Keras, keras_of

    mine = keras_of(model, "a migratable job's build_model()").value
    if state.keras != mine:
        names = {Keras.KERAS2.value: "Keras 2 (tf_keras)", Keras.KERAS3.value: "Keras 3"}
        raise CheckpointError(f"The checkpoint in {str(out_dir)!r} was written by a {names[state.keras]} model and "
                              f"this job's build_model() returns a {names[mine]} model: a job moves between "
                              "placements, not between Kerases. Resume it with the job as it was written, or start "
                              "this one in another directory.")


@renamed(directory="out_dir")
def step_directory(out_dir: str | os.PathLike[str], step: int) -> Path:
    return Path(out_dir) / f"step-{step:08d}"


@renamed(directory="out_dir")
def latest(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint of ``out_dir`` (None: it holds none)."""
    pointer = Path(out_dir) / LATEST
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise CheckpointError(f"{str(out_dir)!r} is a file; expected the checkpoint directory of a migratable job.")
    if not pointer.exists():
        return None
    if not pointer.is_file():
        raise CheckpointError(f"{pointer} is a folder; expected the migration checkpoint pointer (a JSON file).")
    data = pointer.read_bytes()
    try:
        name = json.loads(data.decode())["checkpoint"]
    except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError too: another kind of file
        raise CheckpointError(f"{pointer} is not a migration checkpoint pointer ({type(exc).__name__}: {exc}). "
                              f"Received: {data[:200]!r}") from None
    path = Path(out_dir) / name
    if not (path / _STATE).exists():
        raise CheckpointError(f"{pointer} names {name!r}, which is incomplete or gone: {path} has no {_STATE}.")
    return path


@renamed(directory="out_dir")
def read_state(out_dir: str | os.PathLike[str]) -> tuple[JobProgress, Path]:
    """The state of the newest checkpoint in ``out_dir`` and that checkpoint's path.

    Raises:
        CheckpointError: ``out_dir`` holds no complete migration checkpoint.
    """
    path = latest(out_dir)
    if path is None:
        raise CheckpointError(f"No migration checkpoint to resume from in {str(out_dir)!r}: it has no {LATEST}. "
                              "Start the job without resume_from (it writes its checkpoints there), or name the "
                              "directory a migratable job wrote.")
    try:
        return JobProgress.from_dict(json.loads((path / _STATE).read_text())), path
    except (ValueError, TypeError, OSError) as exc:  # OSError: a folder where the file should be
        raise CheckpointError(f"{path / _STATE} is not a job state ({type(exc).__name__}: {exc}).") from None


def tf_checkpoint_prefix(path: str | os.PathLike[str]) -> str:
    return str(Path(path) / _CKPT)


@renamed(directory="out_dir")
def write_checkpoint(out_dir: str | os.PathLike[str], state: JobProgress, checkpoint: Any, *, chief: bool) -> Path:
    """Writes ``checkpoint`` (a ``tf.train.Checkpoint``) and ``state`` as the newest checkpoint.

    Every task calls it (saving can read distributed variables); only the chief's files are kept,
    the others write to a scratch directory that is removed. The checkpoint is complete before
    ``latest.json`` names it.
    """
    target = step_directory(out_dir, state.step)
    scratch = Path(tempfile.mkdtemp(prefix=".writing-", dir=out_dir if chief else None))
    try:
        checkpoint.write(tf_checkpoint_prefix(scratch))
        if not chief:
            return target
        write_json(scratch / _STATE, state.as_dict())
        if target.exists():
            shutil.rmtree(target)
        os.replace(scratch, target)
        write_json(Path(out_dir) / LATEST, {"checkpoint": target.name, "step": state.step})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _prune(Path(out_dir), keep=target.name)
    return target


def _prune(directory: Path, *, keep: str) -> None:
    """Removes older checkpoints (and scratch left by killed writers), keeping ``keep`` and its predecessor."""
    steps = sorted(p.name for p in directory.glob("step-*") if p.is_dir())
    if keep in steps:
        for name in steps[:max(0, steps.index(keep) - 1)]:
            shutil.rmtree(directory / name, ignore_errors=True)
