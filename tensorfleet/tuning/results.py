"""The results of a search: one record per trial, as a table, JSON and PNG plots.

Files written into the search's output directory, each atomically:

* ``results.json``: the objective, its direction, the best trial and every trial's record;
* ``results.txt``: the table (trial, hyperparameters, objective, time, status);
* ``objective.png``: the objective of each trial in order, with the best so far as a line;
* ``hyperparameters.png``: each hyperparameter against the objective, one panel each.

Example:
    >>> records = [TrialRecord("0", "COMPLETED", {"units": 32}, 0.9, 1, 2.5),
    ...            TrialRecord("1", "COMPLETED", {"units": 64}, 0.95, 2, 3.0)]
    >>> best_so_far([r.score for r in records], "max")
    [0.9, 0.95]
    >>> print(format_table(records, objective="val_accuracy"))
    trial  units  val_accuracy  time (s)  status
    0      32     0.9000        2.5       COMPLETED
    1      64     0.9500        3.0       COMPLETED
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tensorfleet.io import save_figure, write_json, write_text
from tensorfleet.validation import renamed

__all__ = ["TrialRecord", "best_so_far", "best_record", "format_table", "read_results", "write_results",
           "RESULTS_FILE"]

RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class TrialRecord:
    """One trial: its id, Keras Tuner status, hyperparameter values, objective score (None when it
    has none), best epoch, wall time of its last run in seconds, runs, and failure message."""

    trial_id: str
    status: str
    hyperparameters: dict[str, Any]
    score: float | None
    best_step: int | None
    seconds: float | None
    runs: int = 1
    message: str | None = None
    tuner: str | None = field(default=None)

    @classmethod
    def from_trial(cls, trial: Any, times: dict[str, Any], *, order: Sequence[str] = ()) -> "TrialRecord":
        """The record of a Keras Tuner ``Trial`` and its entry of ``times.json``; its hyperparameters
        in the order of ``order`` (the search space's), then any others."""
        start, end = times.get("start"), times.get("end")
        score = float(trial.score) if trial.score is not None and math.isfinite(trial.score) else None
        values = dict(trial.hyperparameters.values)
        values = {**{k: values[k] for k in order if k in values}, **values}
        return cls(trial.trial_id, str(trial.status), values, score, trial.best_step,
                   end - start if start and end else None, int(times.get("runs", 1)),
                   trial.message.strip().splitlines()[-1] if trial.message else None, times.get("tuner"))


def best_so_far(scores: list[float | None], direction: str) -> list[float | None]:
    """The best score among the first i trials, for each i (None until a trial has a score)."""
    best: float | None = None
    out: list[float | None] = []
    for score in scores:
        if score is not None and (best is None or (score > best if direction == "max" else score < best)):
            best = score
        out.append(best)
    return out


def best_record(records: list[TrialRecord], direction: str) -> TrialRecord | None:
    """The completed trial with the best score (the first of equals), or None."""
    scored = [(r.score, r) for r in records if r.status == "COMPLETED" and r.score is not None]
    if not scored:
        return None
    return (max if direction == "max" else min)(scored, key=lambda pair: pair[0])[1]


def _names(records: list[TrialRecord]) -> list[str]:
    names: list[str] = []
    for record in records:
        names += [k for k in record.hyperparameters if k not in names and not k.startswith("tuner/")]
    return names


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(records: list[TrialRecord], *, objective: str) -> str:
    """The trials as an aligned text table: trial, each hyperparameter, the objective, time, status."""
    names = _names(records)
    rows = [["trial", *names, objective, "time (s)", "status"]]
    for r in records:
        rows.append([r.trial_id, *(_cell(r.hyperparameters.get(n)) for n in names),
                     "-" if r.score is None else f"{r.score:.4f}",
                     "-" if r.seconds is None else f"{r.seconds:.1f}", r.status])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


@renamed(out="out_dir")
def write_results(out_dir: Path, records: list[TrialRecord], *, objective: str, direction: str,
                  best_model: str | None) -> dict[str, Any]:
    """Writes ``results.json``, ``results.txt`` and the two PNGs into ``out_dir``; returns the JSON."""
    best = best_record(records, direction)
    summary = {"objective": objective, "direction": direction,
               "best": None if best is None else {"trial_id": best.trial_id, "score": best.score,
                                                  "hyperparameters": best.hyperparameters, "model": best_model},
               "trials": [asdict(r) for r in records]}
    write_text(out_dir / "results.txt", format_table(records, objective=objective) + "\n")
    plot_results(out_dir, records, objective=objective, direction=direction)
    write_json(out_dir / RESULTS_FILE, summary)
    return summary


@renamed(out="out_dir")
def read_results(out_dir: str | Path) -> tuple[dict[str, Any], list[TrialRecord]]:
    """``results.json`` of a search's output directory and its trial records.

    Raises:
        FileNotFoundError: no ``out_dir`` folder, or no ``results.json`` in it (or a folder in its place).
        UnreadableFileError: ``results.json`` is empty, not text, not JSON or not a search's results (a ValueError).
    """
    import json

    from tensorfleet.io import UnreadableFileError, existing_folder, read_text

    path = existing_folder(out_dir, "a search's output folder") / RESULTS_FILE
    text = read_text(path, f"the {RESULTS_FILE} a search writes")
    try:
        summary = json.loads(text)
        return summary, [TrialRecord(**t) for t in summary["trials"]]
    except (ValueError, KeyError, TypeError) as error:
        raise UnreadableFileError(f"{str(path)!r} is not the {RESULTS_FILE} of a search ({type(error).__name__}: "
                                  f"{error}); expected the JSON a search writes (its trials).") from None


@renamed(out="out_dir")
def plot_results(out_dir: Path, records: list[TrialRecord], *, objective: str, direction: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ids = [r.trial_id for r in records]
    scores = [r.score for r in records]
    ax.plot(range(len(ids)), [math.nan if s is None else s for s in scores], "o", label=objective)
    ax.step(range(len(ids)), [math.nan if b is None else b for b in best_so_far(scores, direction)],
            where="post", label="best so far")
    ax.set_xticks(range(len(ids)), ids, rotation=90 if len(ids) > 20 else 0)
    ax.set(xlabel="trial", ylabel=objective, title=f"{objective} per trial ({direction})")
    ax.legend()
    paths = [save_figure(fig, out_dir / "objective.png")]
    names = _names(records)
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(3.2 * max(len(names), 1), 3), squeeze=False)
    for ax, name in zip(axes[0], names):
        pairs = [(r.hyperparameters[name], r.score)
                 for r in records if name in r.hyperparameters and r.score is not None]
        values = [p[0] for p in pairs]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            ax.plot(values, [p[1] for p in pairs], "o")
            if min(values) > 0 and max(values) / min(values) >= 100:
                ax.set_xscale("log")
            elif all(isinstance(v, int) for v in values):  # hp.Int: ticks on whole values only
                distinct = sorted(set(values))
                if len(distinct) <= 8:
                    ax.set_xticks(distinct)
                else:
                    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        else:  # choices of strings or booleans: one column each
            labels = sorted({str(v) for v in values})
            ax.plot([labels.index(str(v)) for v in values], [p[1] for p in pairs], "o")
            ax.set_xticks(range(len(labels)), labels)
        ax.set(xlabel=name, ylabel=objective if ax is axes[0][0] else None)
    fig.tight_layout()
    paths.append(save_figure(fig, out_dir / "hyperparameters.png"))
    return paths
