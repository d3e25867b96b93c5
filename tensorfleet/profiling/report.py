"""What a person reads from an analysed capture: a table, JSON, a PNG and a Perfetto/Chrome trace.

:func:`write_report` writes, atomically, beside the tasks' directories:

- ``profile.json``: every step of every device of every task, the per-task means and the verdict;
- ``profile.png``: stacked time per step (compute, exposed communication, input, idle), one panel per
  task, so a straggler's different shape shows at a glance;
- ``trace.json``: the profiler's own trace-viewer conversion of each task's XSpace
  (the ``trace_viewer`` tool of xprof, or of tensorboard-plugin-profile on the tff track), the tasks
  merged as separate processes;
  it opens in https://ui.perfetto.dev or ``chrome://tracing``.

The TensorBoard profile directories stay as they are (``tensorboard --logdir DIR``, Profile tab).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tensorfleet.io import save_figure, write_json, write_text
from tensorfleet.profiling.breakdown import JobProfile

__all__ = ["format_table", "plot_steps", "chrome_trace", "write_report", "PARTS", "REPORT_FILES"]

PARTS = (("compute_ms", "compute", "#4c72b0"), ("exposed_communication_ms", "communication", "#dd8452"),
         ("input_ms", "input", "#55a868"), ("idle_ms", "idle", "#c7c7c7"))
REPORT_FILES = {"json": "profile.json", "png": "profile.png", "trace": "trace.json"}
_PID_STRIDE = 100_000  # keeps each task's processes apart in the merged trace


def format_table(profile: JobProfile) -> str:
    """The per-task means and the verdict as aligned text.

    Communication is the exposed part, its overlap with compute in parentheses; "own" is the step
    less the time waiting for other tasks. A ps task's row is per step it served (its steps), a
    coordinator's is the time it took to schedule each step.
    """
    header = ("task", "role", "steps", "step ms", "compute", "comm (overlap)", "input", "idle", "own work")
    rows = [header]
    for t in profile.tasks:
        rows.append((t.task, t.role.value, str(t.steps), f"{t.step_ms:.2f}", f"{t.compute_ms:.2f}",
                     f"{t.exposed_communication_ms:.2f} ({t.overlap:.0%})", f"{t.input_ms:.2f}", f"{t.idle_ms:.2f}",
                     f"{t.own_work_ms:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    verdict = profile.verdict
    lines += ["", f"verdict: {verdict.bottleneck.value}", f"  {verdict.reason}", f"  change: {verdict.advice}"]
    return "\n".join(lines)


def plot_steps(profile: JobProfile) -> Any:
    """A matplotlib figure: per task, one stacked bar per recorded step (host device)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    tasks = [t.task for t in profile.tasks]
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(5.0, 3.2 * len(tasks)), 3.6), sharey=True, squeeze=False)
    hosts = {t.task: _host_device(profile, t.task) for t in profile.tasks}
    roles = {t.task: t.role.value for t in profile.tasks}
    for ax, task in zip(axes[0], tasks):
        rows = [s for s in profile.steps if s.task == task and s.device == hosts[task]]
        role = roles[task]
        labels = ["per step served"] if role == "ps" else [str(s.step) for s in rows]
        bottom = [0.0] * len(rows)
        for field, name, color in PARTS:
            values = [getattr(s, field) for s in rows]
            ax.bar(labels, values, bottom=bottom, color=color, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        note = "straggler" if task == profile.verdict.straggler else "" if role == "trainer" else role
        ax.set_title(task + (f"  ({note})" if note else ""), fontsize=10)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("time per step (ms)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(PARTS), fontsize=8, frameon=False)
    fig.suptitle(f"{profile.verdict.bottleneck.value}: {profile.verdict.advice.split(':')[0]}", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _host_device(profile: JobProfile, task: str) -> str:
    devices = [s.device for s in profile.steps if s.task == task]
    hosts = [d for d in devices if d.startswith("/host:")]
    return (hosts or devices or ["/host:CPU"])[0]


def chrome_trace(profile: JobProfile) -> dict[str, Any]:
    """The tasks' traces in Chrome's trace-event format, converted by the profiler plugin itself."""
    from tensorfleet.compat.profiler import trace_viewer_json

    merged: dict[str, Any] = {"displayTimeUnit": "ns", "traceEvents": []}
    for number, trace in enumerate(profile.traces, start=1):
        data = trace_viewer_json(str(trace.path))
        if not data:
            raise ValueError(f"The profiler could not convert {str(trace.path)!r} to a trace.")
        for event in json.loads(data).get("traceEvents", []):
            if "pid" in event:
                event["pid"] = number * _PID_STRIDE + int(event["pid"])
            if event.get("name") == "process_name" and "args" in event:
                event["args"]["name"] = f"{trace.task} {event['args'].get('name', '')}".strip()
            merged["traceEvents"].append(event)
    return merged


def write_report(profile: JobProfile, out_dir: str | Path | None = None, *,
                 extra: dict[str, Any] | None = None) -> dict[str, Path]:
    """Writes ``profile.json`` (with ``extra`` merged in), ``profile.png`` and ``trace.json`` into
    ``out_dir`` (default: the analysed directory); returns their paths by kind (``json``, ``png``, ``trace``)."""
    target = out_dir if out_dir is not None else profile.out_dir
    if target is None:
        raise ValueError("out_dir is needed for a profile that was not read from a directory.")
    out = Path(target)
    paths = {kind: out / name for kind, name in REPORT_FILES.items()}
    write_json(paths["json"], {**profile.as_dict(), **(extra or {})})
    save_figure(plot_steps(profile), paths["png"])
    write_text(paths["trace"], json.dumps(chrome_trace(profile)))
    return paths
