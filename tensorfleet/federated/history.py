"""What a simulation recorded: per-round metrics (:class:`History`), read back from a run's
``out_dir`` (:func:`load_history`) and drawn as PNG plots (:func:`plot_history`).

Example:
    >>> history = History(rounds=[{"round": 1, "train_accuracy": 0.5, "train_loss": 1.2},
    ...                           {"round": 2, "train_accuracy": 0.75, "train_loss": 0.8}], config={"algorithm": "fedavg"})
    >>> history.final("train_accuracy"), history.rounds_to("train_accuracy", 0.7)
    (0.75, 2)
    >>> history.save("runs/a")
    >>> load_history("runs/a").rounds == history.rounds
    True
    >>> [p.name for p in plot_history(history, "runs/a")]
    ['accuracy.png', 'loss.png']
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

__all__ = ["HISTORY_FILE", "History", "load_history", "plot_history"]

HISTORY_FILE = "metrics.json"


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
    """Reads the ``metrics.json`` a simulation wrote into ``out_dir``."""
    path = Path(out_dir) / HISTORY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No {HISTORY_FILE} in {out_dir}; is it the out_dir of a simulation run?")
    data = json.loads(path.read_text())
    return History(rounds=data["rounds"], config=data.get("config", {}))


def plot_history(history: History, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Writes ``accuracy.png`` and ``loss.png`` (train, central test, federated eval per round)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    for metric in ("accuracy", "loss"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for prefix, label in (("train", "train (clients)"), ("test", "central test"), ("fed_eval", "federated eval")):
            pts = [(r["round"], r[f"{prefix}_{metric}"]) for r in history.rounds if r.get(f"{prefix}_{metric}") is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.set_ylabel(metric)
        title = history.config.get("algorithm", "")
        ax.set_title(f"{title} {metric} per round".strip())
        ax.grid(alpha=0.3)
        ax.legend()
        written.append(save_figure(fig, Path(out_dir) / f"{metric}.png"))
    return written
