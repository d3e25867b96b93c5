"""What a distributed search is: its options, checked once at the boundary, and the user's script.

A search script is plain Python that defines two functions:

* ``build_model(hp)``: Keras Tuner's convention, a compiled Keras model built from the
  hyperparameters ``hp`` (``hp.Int``, ``hp.Float``, ``hp.Choice``, ...);
* ``data()``: the training and validation data, either ``(x, y, x_val, y_val)`` (arrays, fitted
  with ``--batch-size``) or ``(train_dataset, val_dataset)`` (batched ``tf.data`` datasets).

The options are written to ``OUT/search.json``, which the chief and every tuner worker read,
so that all processes of one search agree and ``--resume`` can check it continues the same search.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tensorfleet.io import write_json
from tensorfleet.validation import choice, integer, optional_boolean, positive_int, renamed, renamed_fields

__all__ = ["SearchAlgorithm", "Direction", "SearchConfig", "TRIAL_STRATEGIES", "TunerKerasError", "check_saved_search",
           "enum_options", "fresh_to_resume", "should_resume", "check_script", "SCRIPT_FUNCTIONS"]


class TunerKerasError(TypeError):
    """``build_model`` returns models of one Keras while the search's Keras Tuner drives the other
    (see :func:`tensorfleet.tuning.task.checked_hypermodel`)."""

# Strategies a trial can run under inside one tuner worker process (no cluster of its own).
TRIAL_STRATEGIES = ("one_device", "mirrored", "central_storage", "auto")
SCRIPT_FUNCTIONS = ("build_model", "data")
CONFIG_FILE = "search.json"


class SearchAlgorithm(str, Enum):
    """Keras Tuner's search algorithms (its oracles)."""

    RANDOM = "random"
    BAYESIAN = "bayesian"
    HYPERBAND = "hyperband"


class Direction(str, Enum):
    """Whether a larger or a smaller objective is better."""

    MAX = "max"
    MIN = "min"


@renamed_fields(out="out_dir")
@dataclass(frozen=True)
class SearchConfig:
    """The options of one search, validated on construction.

    ``epochs`` is each trial's number of epochs (Hyperband's ``max_epochs``); ``max_restarts``
    is how many restarts of tuner workers the search allows (a restarted tuner's trial runs again);
    ``pin_cores`` pins worker ``i`` to core ``i`` modulo the machine's cores, one core per trial.
    """

    script: str
    out_dir: str
    workers: int = 2
    max_trials: int = 10
    objective: str = "val_accuracy"
    direction: Direction | None = None
    algorithm: SearchAlgorithm = SearchAlgorithm.RANDOM
    strategy: str = "one_device"
    devices_per_trial: int = 1
    epochs: int = 5
    batch_size: int = 32
    seed: int = 0
    max_restarts: int = 3
    pin_cores: bool = False

    def __post_init__(self) -> None:
        for name in ("workers", "max_trials", "devices_per_trial", "epochs", "batch_size"):
            positive_int(name, getattr(self, name))
        integer("seed", self.seed, minimum=0)
        integer("max_restarts", self.max_restarts, minimum=0)
        if not isinstance(self.objective, str) or not self.objective.strip():
            raise ValueError(f"objective must be a metric name such as 'val_accuracy'. Received: {self.objective!r}")
        object.__setattr__(self, "algorithm", choice(SearchAlgorithm, "algorithm", self.algorithm))
        if self.direction is not None:
            object.__setattr__(self, "direction", choice(Direction, "direction", self.direction))
        object.__setattr__(self, "strategy", _trial_strategy(self.strategy, self.devices_per_trial))
        object.__setattr__(self, "script", str(Path(self.script).resolve()))
        object.__setattr__(self, "out_dir", str(Path(self.out_dir).resolve()))

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["algorithm"] = self.algorithm.value
        data["direction"] = self.direction.value if self.direction else None
        return data

    def save(self) -> Path:
        return write_json(Path(self.out_dir) / CONFIG_FILE, self.as_dict())

    @classmethod
    @renamed(out="out_dir")
    def load(cls, out_dir: str | Path) -> "SearchConfig":
        """The search saved in ``out_dir``; ValueError naming the file when it is not one (damaged, or another file).

        Raises:
            FileNotFoundError: no ``search.json`` in ``out_dir``.
            UnreadableFileError: ``search.json`` is empty, not text, not JSON or not a search's options.
        """
        from tensorfleet.io import UnreadableFileError, read_text

        path = Path(out_dir) / CONFIG_FILE
        text = read_text(path, f"the {CONFIG_FILE} of a tensorfleet tune search")
        try:
            data = json.loads(text)
            if isinstance(data, dict) and "out" in data and "out_dir" not in data:  # saved by the previous release
                data["out_dir"] = data.pop("out")
            return cls(**data)
        except (ValueError, TypeError) as error:
            raise UnreadableFileError(f"{str(path)!r} is not the {CONFIG_FILE} of a search ({type(error).__name__}: "
                                      f"{error}); resume=False (--fresh) starts the search over.") from None

    def differences(self, other: "SearchConfig") -> list[str]:
        """The options that make ``other`` a different search (the ones a resume must keep)."""
        keep = ("script", "objective", "direction", "algorithm", "max_trials", "epochs", "seed")
        return [f"{k}={getattr(other, k)!r} (the search has {getattr(self, k)!r})"
                for k in keep if getattr(self, k) != getattr(other, k)]


def _trial_strategy(name: str, devices: int) -> str:
    from tensorfleet.strategies.registry import STRATEGIES

    canonical = STRATEGIES.canonical(name)  # unknown names: the registry's did-you-mean error
    if canonical not in TRIAL_STRATEGIES:
        raise ValueError(f"strategy must run inside one tuner worker: one of {', '.join(TRIAL_STRATEGIES)}. "
                         f"Received: strategy={name!r}")
    if canonical == "one_device" and devices > 1:
        raise ValueError(f"devices_per_trial={devices} needs a strategy over several devices "
                         "(mirrored or central_storage). Received: strategy='one_device'")
    return canonical


def check_script(path: str | Path) -> Path:
    """``path`` if it is a Python file that defines ``build_model`` and ``data`` at top level.

    Read with ``ast``, without running it (running it imports TensorFlow), so a wrong script is
    refused before any process starts; the tuner processes check again what they load.
    """
    from tensorfleet.io import read_text

    script = Path(path)
    text = read_text(script, "a Python search script defining build_model(hp) and data()", empty=True)
    try:
        tree = ast.parse(text, filename=str(script))
    except SyntaxError as exc:
        raise ValueError(f"The search script {str(path)!r} is not valid Python: {exc.msg} (line {exc.lineno}).")
    missing = [name for name in SCRIPT_FUNCTIONS if name not in _top_level_names(tree)]
    if missing:
        raise ValueError(missing_functions_message(str(path), missing))
    return script


def check_saved_search(project: str | Path) -> None:
    """Refuses a saved search (Keras Tuner's project folder: ``oracle.json`` and ``trial_*/trial.json``; and the
    trials' times, ``times.json`` beside it) that the oracle could not reload, before any process starts: each that is
    there must be a JSON object.

    Raises:
        FileNotFoundError: ``project`` is missing, or a file; or a folder is where one of its files should be.
        UnreadableFileError: one of the files is empty, not text or not a JSON object; the message names it.
    """
    from tensorfleet.io import UnreadableFileError, existing_folder, read_text

    folder = existing_folder(project, "the oracle's folder of a saved search")
    for path in [folder / "oracle.json", *sorted(folder.glob("trial_*/trial.json")), folder.parent / "times.json"]:
        if not path.exists():  # a chief stopped before its first save: the oracle begins afresh
            continue
        text = read_text(path, "the JSON state of a saved search")
        try:
            state = json.loads(text)
        except ValueError as error:
            state = f"{type(error).__name__}: {error}"
        else:
            state = state if isinstance(state, dict) else f"JSON {type(state).__name__}, not an object"
        if not isinstance(state, dict):
            raise UnreadableFileError(f"{str(path)!r} is not the JSON state of a saved search ({state}); "
                                      "resume=False (--fresh) starts the search over.")


def enum_options(direction: str | Direction | None, algorithm: str | SearchAlgorithm) -> dict[str, Any]:
    """:class:`SearchConfig`'s ``direction`` and ``algorithm`` from their words, as the API, the command line
    and the manifests take them (checked as the config checks them)."""
    return {"direction": None if direction is None else choice(Direction, "direction", direction),
            "algorithm": choice(SearchAlgorithm, "algorithm", algorithm)}


def fresh_to_resume(value: bool) -> bool | None:
    """The older ``fresh=True`` (delete the saved search, begin again) is ``resume=False``; ``fresh=False`` is
    the default, ``resume=None``."""
    return False if value else None


def should_resume(out_dir: str | Path, resume: bool | None, *, saved: bool) -> bool:
    """Whether a search continues the one saved in ``out_dir`` (``saved``: there is one), by the package's
    meaning of ``resume`` (docs/glossary.md): None continues a saved search and begins one otherwise, True
    continues (ValueError when there is none), False begins again (the caller deletes what was saved)."""
    optional_boolean("resume", resume)
    if resume is True and not saved:
        raise ValueError(f"Nothing to resume in {str(out_dir)!r}: it holds no search. Received: resume=True "
                         "(--resume); leave resume unset (no --resume) to begin one.")
    return saved if resume is None else resume


def missing_functions_message(path: str, missing: list[str]) -> str:
    return (f"The search script {path!r} defines no {' and no '.join(missing)}. It must define build_model(hp), "
            "returning a compiled Keras model built from the hyperparameters hp, and data(), returning "
            "(x, y, x_val, y_val) or (train_dataset, val_dataset).")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names
