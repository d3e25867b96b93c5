"""A simulation's checkpoint: the full algorithm state after a round, refused by another configuration.

One ``checkpoint.npz`` in the run's ``out_dir``, written atomically: the state's tensors as
``leaf_00000``, ``leaf_00001``, ... and a ``__meta__`` entry (JSON) with the round, the history so far,
the configuration and its :func:`fingerprint` (a hash of everything that changes the trajectory,
``rounds`` aside, and of the client data). A run resumes only from a checkpoint of its own
fingerprint.

Example:
    >>> import numpy as np
    >>> config = {"algorithm": "fedavg", "rounds": 2, "seed": 0}
    >>> mark = fingerprint(config, ["client_0", "client_1"])
    >>> path = save_checkpoint("runs/a", [np.ones(3)], round_num=1, fingerprint=mark, config=config, history=[])
    >>> leaves, round_num, history = read_checkpoint("runs/a", mark, config)
    >>> leaves[0].tolist(), round_num
    ([1.0, 1.0, 1.0], 1)
    >>> read_checkpoint("runs/a", "another", {**config, "seed": 1})
    Traceback (most recent call last):
    tensorfleet.federated.checkpoint.CheckpointMismatchError: The checkpoint in runs/a comes from a different configuration (seed: checkpoint 0 vs now 1). Use another out_dir, or resume=False to start over.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tensorfleet.io import write_bytes

__all__ = ["CHECKPOINT_FILE", "CheckpointAheadError", "CheckpointMismatchError", "check_shapes", "checkpoint_config",
           "fingerprint", "read_checkpoint", "save_checkpoint"]

CHECKPOINT_FILE = "checkpoint.npz"


class CheckpointMismatchError(ValueError):
    """A checkpoint in ``out_dir`` was written by a simulation of another configuration.

    Attributes:
        reason: what does not match, without the remedy (the CLI words its own:
            ``--out`` and ``--fresh`` for ``out_dir`` and ``resume=False``).
    """

    remedy = "Use another out_dir, or resume=False to start over."

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} {self.remedy}")
        self.reason = reason


class CheckpointAheadError(CheckpointMismatchError):
    """The checkpoint in ``out_dir`` is past the rounds asked for: it cannot be continued to them.

    Attributes:
        checkpoint_round: the round the checkpoint was written after.
    """

    def __init__(self, out_dir: str | os.PathLike[str], checkpoint_round: int, rounds: int) -> None:
        self.checkpoint_round = checkpoint_round
        self.remedy = (f"Ask for rounds={checkpoint_round} or more to continue it, or use another out_dir, "
                       f"or resume=False to start over.")
        super().__init__(f"The checkpoint in {Path(out_dir)} was written after round {checkpoint_round}, past "
                         f"rounds={rounds}.")


def fingerprint(config: dict[str, Any], train_ids: Sequence[str], clients: Any = None) -> str:
    """A hash of ``config`` (not ``rounds``) and of the training clients' data.

    With ``partition()`` client data (which has ``indices`` and ``y``) every client's example
    indices and the labels count; otherwise the client ids.
    """
    trajectory = {k: v for k, v in config.items() if k != "rounds"}
    digest = hashlib.sha256(json.dumps(trajectory, sort_keys=True, default=str).encode())
    if hasattr(clients, "indices"):
        for cid in train_ids:
            digest.update(np.ascontiguousarray(clients.indices(cid)).tobytes())
        digest.update(hashlib.sha256(np.ascontiguousarray(clients.y).tobytes()).digest())
    else:
        digest.update("\n".join(train_ids).encode())
    return digest.hexdigest()[:16]


def save_checkpoint(out_dir: str | os.PathLike[str], leaves: Sequence[Any], *, round_num: int, fingerprint: str,
                    config: dict[str, Any], history: list[dict[str, Any]]) -> Path:
    """Writes the state's ``leaves`` after ``round_num`` into ``out_dir/checkpoint.npz`` (atomically)."""
    buffer = io.BytesIO()
    arrays = {f"leaf_{i:05d}": np.asarray(v) for i, v in enumerate(leaves)}
    meta = json.dumps({"round": round_num, "fingerprint": fingerprint, "config": config, "history": history})
    np.savez(buffer, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **arrays)
    return write_bytes(Path(out_dir) / CHECKPOINT_FILE, buffer.getvalue())


def read_checkpoint(out_dir: str | os.PathLike[str], fingerprint: str,
                    config: dict[str, Any]) -> tuple[list[np.ndarray], int, list[dict[str, Any]]] | None:
    """``(leaves, round, history)`` of ``out_dir``'s checkpoint, or None when there is none.

    Raises:
        CheckpointMismatchError: the checkpoint's fingerprint is not ``fingerprint``; the message
            names the keys of ``config`` that differ (or the client data).
    """
    path = Path(out_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode())
        if meta["fingerprint"] != fingerprint:
            theirs = meta["config"]
            diff = sorted(k for k in set(theirs) | set(config) if k != "rounds" and theirs.get(k) != config.get(k))
            detail = ", ".join(f"{k}: checkpoint {theirs.get(k)!r} vs now {config.get(k)!r}" for k in diff)
            raise CheckpointMismatchError(
                f"The checkpoint in {path.parent} comes from a different configuration ({detail or 'client data'}).")
        leaves = [data[f"leaf_{i:05d}"] for i in range(len(data.files) - 1)]
    return leaves, int(meta["round"]), list(meta["history"])


def checkpoint_config(out_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The configuration recorded in ``out_dir``'s checkpoint, or None when there is none."""
    path = None if out_dir is None else Path(out_dir) / CHECKPOINT_FILE
    if path is None or not path.is_file():
        return None
    with np.load(path) as data:
        return dict(json.loads(bytes(data["__meta__"]).decode())["config"])


def check_shapes(out_dir: str | os.PathLike[str], leaves: Sequence[Any], template: Sequence[Any]) -> None:
    """CheckpointMismatchError when the checkpoint's tensors do not have the shapes of ``template``."""
    shapes = [np.shape(v) for v in leaves]
    expected = [np.shape(v) for v in template]
    if shapes != expected:
        raise CheckpointMismatchError(f"The checkpoint in {Path(out_dir)} holds tensors of shapes {shapes[:6]}...; "
                                      f"this configuration's model state has {expected[:6]}... (another model?).")
