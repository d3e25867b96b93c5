"""A simulation's checkpoint: the full algorithm state after a round, refused by another configuration.

One ``checkpoint.npz`` in the run's ``out_dir``, written atomically: the state's tensors as
``leaf_00000``, ``leaf_00001``, ... and a ``__meta__`` entry (JSON) with the round, the history so far,
the configuration and its :func:`fingerprint` (a hash of everything that changes the trajectory,
``rounds`` aside, and of the client data), and the model's architecture (:func:`model_layers`). A run
resumes only from a checkpoint of its own fingerprint and model.

The generation before it is kept as ``checkpoint.previous.npz``: a latest checkpoint that cannot be
read (truncated, overwritten: a disk filled up, a copy cut short) is named in a warning and the run
resumes from the previous one; when neither can be read, :class:`DamagedCheckpointError` names the
file and what to do (start over: ``resume=False``, ``--fresh`` on the command line).

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
    tensorfleet.federated.checkpoint.CheckpointMismatchError: The checkpoint in runs/a comes from a different
    configuration (seed: checkpoint 0 vs now 1). Use another out_dir, or resume=False to start over.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from tensorfleet.io import existing_folder, write_bytes

__all__ = ["CHECKPOINT_FILE", "PREVIOUS_FILE", "CheckpointAheadError", "CheckpointMismatchError",
           "DamagedCheckpointError",
           "check_shapes", "checkpoint_config", "fingerprint", "model_layers", "read_checkpoint", "save_checkpoint"]

CHECKPOINT_FILE = "checkpoint.npz"
PREVIOUS_FILE = "checkpoint.previous.npz"  # the generation before, fallen back to when the latest is damaged


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


class DamagedCheckpointError(CheckpointMismatchError):
    """The checkpoint in ``out_dir`` cannot be read (and no earlier generation can either).

    Attributes:
        path: the damaged file.
        detail: how it is damaged (``truncated: ...``, ``not a checkpoint: ...``).
    """

    remedy = "Start over with resume=False (it overwrites the checkpoint), or use another out_dir."

    def __init__(self, path: Path, detail: str, previous: str = "") -> None:
        self.path, self.detail = path, detail
        super().__init__(f"The checkpoint {path} is damaged ({detail}){previous}.")


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


def model_layers(model: Any) -> list[str]:
    """The model's architecture, one line per layer (nested models' layers in order): its class and its config
    without names, which two builds of one model do not share (``dense`` and ``dense_4``).

    Example: ``['Dense {"activation": "relu", "units": 16, ...}', 'Dense {"activation": "linear", ...}']``.
    """
    def leaves(layer: Any) -> Iterator[Any]:
        inner = getattr(layer, "layers", None)
        if inner:
            for child in inner:
                yield from leaves(child)
        else:
            yield layer

    def unnamed(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: unnamed(v) for k, v in value.items() if k != "name"}
        if isinstance(value, (list, tuple)):
            return [unnamed(v) for v in value]
        return value

    lines = []
    for layer in leaves(model):
        try:
            config = unnamed(layer.get_config())
        except NotImplementedError:  # a custom layer without get_config: its class is what is known
            config = {}
        # an object JSON does not know is named by its type (its repr may hold an address that differs by process)
        lines.append(f"{type(layer).__name__} {json.dumps(config, sort_keys=True, default=lambda o: type(o).__name__)}")
    return lines


def save_checkpoint(out_dir: str | os.PathLike[str], leaves: Sequence[Any], *, round_num: int, fingerprint: str,
                    config: dict[str, Any], history: list[dict[str, Any]], model: list[str] | None = None) -> Path:
    """Writes the state's ``leaves`` after ``round_num`` into ``out_dir/checkpoint.npz`` (atomically); the
    checkpoint it replaces becomes ``checkpoint.previous.npz`` (when it can be read). ``model``: the model's
    :func:`model_layers`, checked when the run resumes."""
    buffer = io.BytesIO()
    # (Any: numpy's stubs read savez's keywords as its own options, not as arrays)
    arrays: dict[str, Any] = {f"leaf_{i:05d}": np.asarray(v) for i, v in enumerate(leaves)}
    record = {"round": round_num, "fingerprint": fingerprint, "config": config, "history": history}
    meta = json.dumps({**record, **({"model": model} if model is not None else {})})
    np.savez(buffer, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **arrays)
    path = Path(out_dir) / CHECKPOINT_FILE
    if path.is_file():
        try:
            _load(path)
            os.replace(path, path.with_name(PREVIOUS_FILE))  # a damaged one would replace a good generation
        except DamagedCheckpointError:
            pass
    return write_bytes(path, buffer.getvalue())


def _load(path: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """``(meta, leaves)`` of the checkpoint file ``path``; DamagedCheckpointError when it cannot be read."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:2] != b"PK":  # numpy would try to unpickle it, and say only that it may not
        raise DamagedCheckpointError(path, f"not a checkpoint: not an .npz archive, it starts with {head!r}")
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data["__meta__"]).decode())
            leaves = [data[f"leaf_{i:05d}"] for i in range(len(data.files) - 1)]
        int(meta["round"]), str(meta["fingerprint"]), dict(meta["config"]), list(meta["history"])
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, TypeError, OSError) as err:
        kind = "truncated" if isinstance(err, (zipfile.BadZipFile, EOFError)) else "not a checkpoint"
        raise DamagedCheckpointError(path, f"{kind}: {type(err).__name__}: {err}") from None
    return meta, leaves


def _readable(out_dir: str | os.PathLike[str]) -> tuple[Path, dict[str, Any], list[np.ndarray]] | None:
    """The newest checkpoint generation in ``out_dir`` that can be read: ``(path, meta, leaves)``; None when
    there is none; a damaged latest one is named in a warning and the previous one read instead."""
    if Path(out_dir).exists():
        existing_folder(out_dir, "a run's out_dir (the folder of its checkpoint.npz)")
    path = Path(out_dir) / CHECKPOINT_FILE
    previous = path.with_name(PREVIOUS_FILE)
    for name in (path, previous):
        if name.exists() and not name.is_file():  # it could never be written over: say so before any round runs
            raise DamagedCheckpointError(name, "not a checkpoint: a folder (or something else that is not a file) "
                                               "is there; expected an .npz file")
    if not path.is_file():
        return None if not previous.is_file() else (previous, *_load(previous))
    try:
        return (path, *_load(path))
    except DamagedCheckpointError as err:
        if not previous.is_file():
            raise
        try:
            found = (previous, *_load(previous))
        except DamagedCheckpointError as worse:
            raise DamagedCheckpointError(path, err.detail, f"; so is the previous generation {previous}") from worse
        warnings.warn(f"{err.reason} Resuming from the previous generation, {previous} (round "
                      f"{found[1]['round']}).", RuntimeWarning, stacklevel=3)
        return found


def read_checkpoint(out_dir: str | os.PathLike[str], fingerprint: str, config: dict[str, Any],
                    model: list[str] | None = None) -> tuple[list[np.ndarray], int, list[dict[str, Any]]] | None:
    """``(leaves, round, history)`` of ``out_dir``'s checkpoint, or None when there is none.

    Raises:
        CheckpointMismatchError: the checkpoint's fingerprint is not ``fingerprint``; the message
            names the keys of ``config`` that differ (or the client data). Or the checkpoint records
            a model (:func:`model_layers`) other than ``model``; the message names the first layer that
            differs. (A checkpoint written before models were recorded is checked by its tensors' shapes.)
        DamagedCheckpointError: neither the checkpoint nor the previous generation can be read.
    """
    found = _readable(out_dir)
    if found is None:
        return None
    path, meta, leaves = found
    if meta["fingerprint"] != fingerprint:
        theirs = meta["config"]
        diff = sorted(k for k in set(theirs) | set(config) if k != "rounds" and theirs.get(k) != config.get(k))
        detail = ", ".join(f"{k}: checkpoint {theirs.get(k)!r} vs now {config.get(k)!r}" for k in diff)
        raise CheckpointMismatchError(
            f"The checkpoint in {path.parent} comes from a different configuration ({detail or 'client data'}).")
    recorded = meta.get("model")
    if model is not None and recorded is not None and list(recorded) != list(model):
        counts = f" ({len(recorded)} layers; this one has {len(model)})" if len(recorded) != len(model) else ""
        raise CheckpointMismatchError(f"The checkpoint in {path.parent} comes from another model{counts}: "
                                      f"{_first_difference(list(recorded), list(model))}.")
    return leaves, int(meta["round"]), list(meta["history"])


def _first_difference(theirs: list[str], ours: list[str]) -> str:
    """Where two :func:`model_layers` first differ, in words: the layer and the keys of its config."""
    first = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
    if first >= min(len(theirs), len(ours)):
        return f"layer {first} is {'only in the checkpoint' if len(theirs) > len(ours) else 'new'}"
    (kind_a, _, text_a), (kind_b, _, text_b) = theirs[first].partition(" "), ours[first].partition(" ")
    if kind_a != kind_b:
        return f"layer {first} is a {kind_a} in the checkpoint and a {kind_b} now"
    a, b = json.loads(text_a), json.loads(text_b)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return f"layer {first} ({kind_a}) has " + ", ".join(f"{k}={a.get(k)!r} in the checkpoint, {b.get(k)!r} now"
                                                       for k in keys)


def checkpoint_config(out_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The configuration recorded in ``out_dir``'s checkpoint, or None when there is none (or none can be read:
    reading it for the run says why)."""
    if out_dir is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            found = _readable(out_dir)
    except DamagedCheckpointError:
        return None
    return None if found is None else dict(found[1]["config"])


def check_shapes(out_dir: str | os.PathLike[str], leaves: Sequence[Any], template: Sequence[Any],
                 ragged: Sequence[int] = ()) -> None:
    """CheckpointMismatchError when the checkpoint's tensors do not have the shapes of ``template``
    (the first axis of the leaves at the positions ``ragged`` may differ: state that grows with the
    clients sampled)."""
    def shape(i: int, v: Any) -> tuple[Any, ...]:
        return ("clients", *np.shape(v)[1:]) if i in ragged else np.shape(v)

    shapes = [shape(i, v) for i, v in enumerate(leaves)]
    expected = [shape(i, v) for i, v in enumerate(template)]
    if shapes != expected:
        raise CheckpointMismatchError(f"The checkpoint in {Path(out_dir)} holds tensors of shapes {shapes[:6]}...; "
                                      f"this configuration's model state has {expected[:6]}... (another model?).")
