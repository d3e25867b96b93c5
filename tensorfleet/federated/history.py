"""What a simulation recorded: per-round metrics (:class:`History`), read back from a run's
``out_dir`` (:func:`load_history`) and drawn as PNG plots (:func:`plot_history`).

Example:
    >>> history = History(rounds=[{"round": 1, "train_accuracy": 0.5, "train_loss": 1.2},
    ...                           {"round": 2, "train_accuracy": 0.75, "train_loss": 0.8}],
    ...                   config={"algorithm": "fedavg"})
    >>> history.final("train_accuracy"), history.rounds_to("train_accuracy", 0.7)
    (0.75, 2)
    >>> history.save("runs/a")
    >>> load_history("runs/a").rounds == history.rounds
    True
    >>> [p.name for p in plot_history(history, "runs/a")]
    ['accuracy.png', 'loss.png']
    >>> run_title({"algorithm": "fedavg", "aggregator": "dp_fixed", "aggregator_options": {"noise_multiplier": 0.5},
    ...            "dp_delta": 1e-5}, epsilon=2.5)
    'fedavg with DP (dp_fixed, noise_multiplier=0.5), ε=2.5 at δ=1e-05'

A DP run also gets ``epsilon.png`` (the privacy spent per round).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorfleet.io import save_figure, write_json, write_text

__all__ = ["HISTORY_FILE", "History", "history_figures", "load_history", "plot_history", "run_title"]

HISTORY_FILE = "metrics.json"
# What a plot's title says an aggregator makes of the run (the mean says nothing).
_AGGREGATOR_KINDS = {"dp_fixed": "DP", "dp_adaptive": "DP", "median": "robust aggregation",
                     "trimmed_mean": "robust aggregation", "krum": "robust aggregation",
                     "compression": "compressed updates"}


@dataclass
class History:
    """Per-round metrics of a simulation.

    Attributes:
        rounds: one dict per completed round (``round``, ``train_loss``, ``train_accuracy``,
            ``clients``, ``participants``, ``test_accuracy`` when evaluated, ...).
        config: the configuration the run was made with.
    """

    rounds: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def column(self, key: str) -> list[Any]:
        """Values of ``key`` over the rounds that have it."""
        return [r[key] for r in self.rounds if r.get(key) is not None]

    def final(self, key: str) -> Any:
        """The last recorded value of ``key``; KeyError when no round has it."""
        values = self.column(key)
        if not values:
            raise KeyError(f"No round recorded {key!r}. Recorded keys: {sorted({k for r in self.rounds for k in r})}")
        return values[-1]

    def rounds_to(self, key: str, target: float) -> int | None:
        """The first round whose ``key`` reaches ``target``, or None."""
        for r in self.rounds:
            if r.get(key) is not None and r[key] >= target:
                return int(r["round"])
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config, "rounds": self.rounds}

    def to_csv(self) -> str:
        keys: list[str] = []
        for r in self.rounds:
            keys.extend(k for k in r if k not in keys)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        for r in self.rounds:
            writer.writerow(r)
        return buffer.getvalue()

    def save(self, out_dir: str | os.PathLike[str]) -> None:
        """Writes ``metrics.json`` and ``metrics.csv`` into ``out_dir`` (atomically)."""
        write_json(Path(out_dir) / HISTORY_FILE, self.as_dict())
        write_text(Path(out_dir) / "metrics.csv", self.to_csv())


def load_history(out_dir: str | os.PathLike[str]) -> History:
    """Reads the ``metrics.json`` a simulation wrote into ``out_dir``.

    Raises:
        FileNotFoundError: no ``metrics.json`` there (the message says what is there).
        UnreadableFileError: a ``metrics.json`` that is not a run's (damaged, another file); the message names it.
    """
    from tensorfleet.io import UnreadableFileError, existing_file, read_text

    path = existing_file(Path(out_dir) / HISTORY_FILE, f"the {HISTORY_FILE} a run writes")
    text = read_text(path, f"the {HISTORY_FILE} a run writes")  # empty or binary: said with its name
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data["rounds"], list):
            raise ValueError("no list of rounds in it")
        return History(rounds=data["rounds"], config=data.get("config", {}))
    except (ValueError, KeyError, TypeError) as error:
        raise UnreadableFileError(f"{str(path)!r} is not the {HISTORY_FILE} of a run ({type(error).__name__}: "
                                  f"{error}); expected the JSON a federated run writes (its rounds and config).") \
            from None


def run_title(config: dict[str, Any], *, epsilon: float | None = None) -> str:
    """What a run is, for plot titles: the algorithm, then DP, robust or compressed aggregation
    with its options, then the final ``epsilon`` (at the config's ``dp_delta``) when given."""
    title = str(config.get("algorithm", ""))
    aggregator = config.get("aggregator")
    if aggregator and aggregator != "mean":
        options = "".join(f", {k}={v}" for k, v in (config.get("aggregator_options") or {}).items())
        kind = _AGGREGATOR_KINDS.get(aggregator, "aggregator")
        title += f" with {kind} ({aggregator}{options})"
    if epsilon is not None:
        title += f", ε={epsilon:.3g}" + (f" at δ={config['dp_delta']:g}" if config.get("dp_delta") else "")
    return title


def _figure(history: History, what: str, ylabel: str) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epsilons = history.column("epsilon")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    ax.set_ylabel(ylabel)
    label = run_title(history.config, epsilon=epsilons[-1] if epsilons else None)
    ax.set_title(f"{label}\n{what}" if label else what, fontsize="medium")
    ax.grid(alpha=0.3)
    return fig, ax


def history_figures(history: History) -> dict[str, Any]:
    """The run's matplotlib figures by name: ``accuracy`` and ``loss`` (train, central test and
    federated eval per round), and ``epsilon`` when the run recorded the privacy it spent."""
    figures = {}
    for metric in ("accuracy", "loss"):
        fig, ax = _figure(history, f"{metric} per round", metric)
        for prefix, label in (("train", "train (clients)"), ("test", "central test"), ("fed_eval", "federated eval")):
            pts = [(r["round"], r[f"{prefix}_{metric}"])
                   for r in history.rounds if r.get(f"{prefix}_{metric}") is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=label)
        ax.legend()
        figures[metric] = fig
    pts = [(r["round"], r["epsilon"]) for r in history.rounds if r.get("epsilon") is not None]
    if pts:
        fig, ax = _figure(history, "privacy spent per round", "ε")
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3)
        figures["epsilon"] = fig
    return figures


def plot_history(history: History, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Writes the :func:`history_figures` as ``accuracy.png``, ``loss.png`` (and ``epsilon.png``)."""
    return [save_figure(fig, Path(out_dir) / f"{name}.png") for name, fig in history_figures(history).items()]
