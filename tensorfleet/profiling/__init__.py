"""Where a job's step time goes, on every worker: capture, analysis, verdict.

Record a TensorFlow profiler trace for chosen steps (:func:`capture`, :class:`ProfileCallback`, or
``TENSORFLEET_PROFILE_STEPS`` with :func:`callbacks`), one directory per task (a parameter-server
job's workers and ps tasks are recorded from its coordinator, :mod:`.remote`); then :func:`analyze`
reads the traces with the profiler's own protos and splits every step of every device and task
into compute, exposed communication, input and idle, measures how much communication hides under
compute and how far the tasks' own work per step spreads, and judges the job input-, communication-,
compute- or straggler-bound with the one change most likely to help. :func:`write_report` writes
the JSON, the PNG and a Perfetto trace; ``tensorfleet profile report DIR`` does all of it.

Example:
    >>> import tensorfleet as tfl
    >>> cb = tfl.profiling.ProfileCallback("profile/", steps="20-30")     # doctest: +SKIP
    >>> model.fit(dataset, epochs=2, callbacks=[cb])                       # doctest: +SKIP
    >>> profile = tfl.profiling.analyze("profile/")                        # doctest: +SKIP
    >>> print(tfl.profiling.format_table(profile))                         # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach

__getattr__, __all__ = attach(__name__, internal=("recorder", "callback", "xspace", "breakdown", "report",
                                                  "intervals", "planned", "remote"), names={
    "capture": "recorder", "callbacks": "recorder", "StepRange": "recorder", "Capture": "recorder",
    "ProfileCallback": "callback",
    "analyze": "breakdown", "Bottleneck": "breakdown", "TaskRole": "breakdown", "JobProfile": "breakdown",
    "Verdict": "breakdown", "StepBreakdown": "breakdown", "TaskSummary": "breakdown",
    "read_xspace": "xspace", "task_traces": "xspace", "compare": "planned", "CommunicationCheck": "planned",
    "format_table": "report", "write_report": "report",
})
if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.profiling.breakdown import (
        Bottleneck,
        JobProfile,
        StepBreakdown,
        TaskRole,
        TaskSummary,
        Verdict,
        analyze,
    )
    from tensorfleet.profiling.callback import ProfileCallback
    from tensorfleet.profiling.planned import CommunicationCheck, compare
    from tensorfleet.profiling.recorder import Capture, StepRange, callbacks, capture
    from tensorfleet.profiling.report import format_table, write_report
    from tensorfleet.profiling.xspace import read_xspace, task_traces

