"""Reading recorded traces: the profiler's ``.xplane.pb`` files, parsed as the XSpace protos they are.

TensorFlow's profiler writes one ``<host>.xplane.pb`` per host and capture into
``<logdir>/plugins/profile/<run>/``. Each is an ``XSpace``: planes (``/host:CPU``, ``/device:GPU:0``),
each with lines (one per thread or stream) of timed events whose names and stats live in the
plane's metadata tables. This module reads them with TensorFlow's own proto classes
(:func:`tensorfleet.compat.profiler.xplane_pb2`) and sorts every event into what the step
analysis needs:

- steps: the ``train`` TraceMe that Keras' ``fit`` (and :func:`tensorfleet.profiling.recorder`)
  wraps around each step, with its ``step_num`` stat;
- compute: TensorFlow op executions (TraceMe events named ``name:OpType``), except function-call
  containers (whose time is the ops inside them) and the tf.data threads' own work;
- communication: collective ops (``Collective*``, ``Nccl*``), send/recv (``_Send``, ``_Recv`` and
  their host forms, which carry parameter-server variable reads and updates; TensorFlow 2.21's
  profiler records the sending side only, no event of the asynchronous ``_Recv``) and RPC events;
- input: the time an iterator's ``GetNext`` waits for the next batch
  (``IteratorGetNextOp::DoCompute``; the ``IteratorGetNext`` op itself is asynchronous).

A parameter-server worker has no ``train`` annotation: the coordinator's Python marks its steps,
and the worker only runs the step function each time the coordinator sends it one. Its steps are
therefore the executions of that function (``EagerLocalExecute: __inference_<name>``, the one it ran
most often), numbered in the order the worker ran them. A ps task runs no step of its own: it runs
the ps part of each worker's step (``EagerLocalExecuteAsync: __inference_<name>_<id>``), counted as
the steps it served.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tensorfleet.validation import renamed

__all__ = ["Step", "DeviceSpans", "TaskTrace", "read_xspace", "find_traces", "task_traces", "PROFILE_SUBDIR",
           "StepSource"]

PROFILE_SUBDIR = Path("plugins") / "profile"
STEP_EVENT = "train"
INPUT_WAIT_EVENTS = frozenset({"IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute"})
INPUT_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
                       "MultiDeviceIteratorGetNextFromShard"})
COMMUNICATION_OPS = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv", "Send", "Recv", "_RecvTensor"})
COMMUNICATION_PREFIXES = ("Collective", "Nccl", "_Nccl")
COMMUNICATION_EVENTS = frozenset({"RecvTensor", "RecvBuf", "RpcRecvTensor", "RpcRecvBuf", "GrpcRemoteRendezvous"})
# The handlers of requests from other tasks (``EagerService:Enqueue`` wraps a whole remote step): their
# time is the ops and waits inside them.
SERVICE_PREFIXES = ("EagerService:", "WorkerService:")
# Ops whose time is the ops they call: counting them would count those ops twice and call a
# function that waits on a collective "compute".
CONTAINER_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "RemoteCall", "While", "If",
                           "StatelessWhile", "StatelessIf", "Case", "StatelessCase", "_MklLayoutDependentOp"})
INPUT_THREAD_PREFIX = "tf_data"  # tf.data's own threads: producing batches is input work, not the step's
FUNCTION_RUN = "EagerLocalExecute: "  # a function a remote coordinator (or this process) runs here, whole
FUNCTION_PART = "EagerLocalExecuteAsync: "  # this task's part of a function another task runs
FUNCTION_PREFIX = "__inference_"  # tf.function's concrete functions, as opposed to single ops


class StepSource(str, Enum):
    """Where a trace's steps come from."""

    ANNOTATION = "annotation"  # the ``train`` TraceMe of fit or capture().step
    FUNCTION = "function"  # executions of the step function a coordinator sent (parameter-server worker)
    NONE = "none"  # no step: a ps task, or a capture of no whole step


@dataclass(frozen=True)
class Step:
    """One recorded training step: its number and its window in milliseconds from trace start."""

    number: int
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


@dataclass
class DeviceSpans:
    """The busy spans of one device (an XPlane) by kind, in milliseconds; unsorted, may overlap."""

    compute: list[tuple[float, float]] = field(default_factory=list)
    communication: list[tuple[float, float]] = field(default_factory=list)
    input: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class TaskTrace:
    """Everything read from one task's capture: its steps and its devices' spans.

    ``served`` counts the step functions whose ps part this task ran (a ps task's work).
    """

    task: str
    path: Path
    hostname: str
    steps: list[Step]
    devices: dict[str, DeviceSpans]
    step_source: StepSource = StepSource.ANNOTATION
    served: int = 0


@dataclass
class _Functions:
    """Function executions seen on a host plane: whole runs and parts, by function name."""

    runs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    parts: Counter = field(default_factory=Counter)

    def add(self, name: str, start: float, end: float) -> None:
        if name.startswith(FUNCTION_RUN + FUNCTION_PREFIX):
            self.runs.setdefault(name[len(FUNCTION_RUN):], []).append((start, end))
        elif name.startswith(FUNCTION_PART + FUNCTION_PREFIX):
            # ``<function>_<id>_<n>``: one id per calling worker
            self.parts[re.sub(r"(_\d+)+$", "", name[len(FUNCTION_PART):])] += 1

    def steps(self) -> list[Step]:
        """The runs of the most often run function, in order, numbered from 0."""
        if not self.runs:
            return []
        name = max(sorted(self.runs), key=lambda n: len(self.runs[n]))
        return [Step(number, start, end) for number, (start, end) in enumerate(sorted(self.runs[name]))]

    def served(self) -> int:
        return max(self.parts.values(), default=0)


def _xplane_pb2() -> Any:
    from tensorfleet.compat.profiler import xplane_pb2

    return xplane_pb2()


def _stat_value(stat: Any) -> Any:
    kind = stat.WhichOneof("value")
    return getattr(stat, kind) if kind else None


def _op_type(metadata: Any) -> str | None:
    """The op type of a TensorFlow op event (named ``name:OpType``, display name ``OpType``)."""
    kind = metadata.display_name
    return kind if kind and metadata.name.endswith(":" + kind) else None


def _kind_of_host_event(metadata: Any, line_name: str) -> str | None:
    if metadata.name.startswith(SERVICE_PREFIXES):
        return None
    op = _op_type(metadata)
    if op is None:
        if metadata.name in INPUT_WAIT_EVENTS:
            return "input"
        return "communication" if metadata.name in COMMUNICATION_EVENTS else None
    if op in INPUT_OPS:
        return "input"
    if op in COMMUNICATION_OPS or op.startswith(COMMUNICATION_PREFIXES):
        return "communication"
    if op in CONTAINER_OPS or line_name.startswith(INPUT_THREAD_PREFIX):
        return None
    return "compute"


def _kind_of_device_event(metadata: Any, line_name: str) -> str | None:
    """Accelerator planes: kernels on stream lines; NCCL kernels are communication."""
    if not line_name.startswith("Stream"):
        return None
    return "communication" if "nccl" in metadata.name.lower() else "compute"


def _read_plane(plane: Any, steps: list[Step], functions: _Functions) -> DeviceSpans:
    stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    is_host = plane.name.startswith("/host:")
    spans = DeviceSpans()
    for line in plane.lines:
        base_ps = line.timestamp_ns * 1000
        for event in line.events:
            metadata = plane.event_metadata[event.metadata_id]
            start = (base_ps + event.offset_ps) / 1e9
            end = start + event.duration_ps / 1e9
            if is_host and metadata.name == STEP_EVENT:
                stats = {stat_names.get(s.metadata_id): _stat_value(s) for s in (*metadata.stats, *event.stats)}
                if stats.get("step_num") is not None:
                    steps.append(Step(int(stats["step_num"]), start, end))
                continue
            if is_host:
                functions.add(metadata.name, start, end)
            kind = (_kind_of_host_event if is_host else _kind_of_device_event)(metadata, line.name)
            if kind is not None:
                getattr(spans, kind).append((start, end))
    return spans


def read_xspace(path: str | Path, *, task: str | None = None) -> TaskTrace:
    """Parses one ``.xplane.pb`` file into its steps and per-device spans.

    Raises:
        ValueError: the file is not an XSpace the profiler wrote.
    """
    path = Path(path)
    space = _xplane_pb2().XSpace()
    try:
        space.ParseFromString(path.read_bytes())
    except Exception as exc:  # the protobuf runtime raises its own DecodeError
        raise ValueError(f"{str(path)!r} is not a profiler trace (an XSpace .xplane.pb): {exc}") from exc
    steps: list[Step] = []
    functions = _Functions()
    devices = {plane.name: _read_plane(plane, steps, functions) for plane in space.planes
               if plane.name.startswith(("/host:", "/device:"))}
    steps.sort(key=lambda s: s.start_ms)
    source = StepSource.ANNOTATION
    if not steps:
        steps = functions.steps()
        source = StepSource.FUNCTION if steps else StepSource.NONE
    hostname = space.hostnames[0] if space.hostnames else path.name.split(".")[0]
    return TaskTrace(task or hostname, path, hostname, steps, devices, source, functions.served())


@renamed(directory="out_dir")
def find_traces(out_dir: str | Path) -> dict[str, list[Path]]:
    """Task name -> the ``.xplane.pb`` files of that task's latest capture under ``out_dir``.

    A task is the folder that holds ``plugins/profile`` (one per task, as
    :func:`tensorfleet.profiling.recorder` writes them); a capture directory given by itself is its
    own task. A capture with several hosts' files names its tasks ``<task>/<host>``.

    Raises:
        FileNotFoundError: ``out_dir`` does not exist or holds no trace.
    """
    from tensorfleet.io import existing_folder

    root = existing_folder(out_dir, "the profile directory a capture wrote")
    runs: dict[Path, list[Path]] = {}
    for pb in sorted(root.rglob("*.xplane.pb")):
        runs.setdefault(pb.parent, []).append(pb)
    latest: dict[Path, Path] = {}
    for run in sorted(runs):  # run folders are named by time: the last is the latest
        owner = run.parents[2] if run.parent.name == "profile" and run.parents[1].name == "plugins" else run
        latest[owner] = run
    if not latest:
        raise FileNotFoundError(f"No profiler trace (*.xplane.pb) under {str(root)!r}. "
                                "Record one with tfl.profiling.capture or ProfileCallback first.")
    found: dict[str, list[Path]] = {}
    for owner, run in sorted(latest.items()):
        # A task folder below the directory is named by its path from it; the directory itself, or a
        # run folder given directly (its task folder is above), by its own name.
        name = owner.relative_to(root).as_posix() if root in owner.parents else root.resolve().name
        found[name] = runs[run]
    return found


@renamed(directory="out_dir")
def task_traces(out_dir: str | Path) -> list[TaskTrace]:
    """Every task's latest capture under ``out_dir`` (the folder a capture wrote), read (see :func:`find_traces`)."""
    traces = []
    for task, files in find_traces(out_dir).items():
        for pb in files:
            name = task if len(files) == 1 else f"{task}/{pb.name.split('.')[0]}"
            traces.append(read_xspace(pb, task=name))
    return traces
