"""The plan that runs: a plan's layout as a :class:`~tensorfleet.model_parallel.mesh.Mesh`, a script run
under it, and what the run holds per device beside what the plan predicted.

A layout of the plan becomes a DTensor mesh (:func:`mesh_spec`):

=================  ==========================  ===================================
plan row           mesh shape                  layout rules
=================  ==========================  ===================================
data_allreduce     ``b:D``                     ``batch:b``
tensor             ``b:1;m:T``                 ``batch:b;hidden:m;heads:m``
hybrid (P = 1)     ``b:D;m:T``                 ``batch:b;hidden:m;heads:m``
=================  ==========================  ===================================

with the plan's ZeRO stage over ``b``. Pipelines (``pipeline``, a hybrid with P > 1) and parameter
servers (``data_ps``) are no mesh layouts: asking for their mesh is one :class:`NotAMeshError`
naming the runnable rows (:mod:`tensorfleet.model_parallel.pipeline` and the ``parameter_server``
strategy run them, outside the plan).

The mesh is a :class:`PlannedMesh`: a Mesh that remembers every model compiled in its scope and
times each training step of its ``fit`` (a Keras callback it adds), so that :meth:`PlannedMesh.report`
can set what the run holds beside the plan's prediction
(:class:`~tensorfleet.planner.run_report.RunReport`). ``tensorfleet plan ... --run script.py`` runs
the script in a process of its own (:func:`run_script`): the plan's devices made there
(``simulate_devices`` on a CPU), the plan's mesh the script's :func:`planned_mesh`.

Example:
    >>> from tensorfleet.planner import plans
    >>> result = plans.plan("digits_cnn", batch_size=64, devices=4, device_memory="16GB", bandwidth="10Gbps",
    ...                     training=plans.TrainingOptions(precision="float32"))
    >>> mesh_spec(result.row("tensor"))
    ('b:1;m:4', 'batch:b;hidden:m;heads:m')
    >>> mesh_spec(result.row("pipeline"))
    Traceback (most recent call last):
    ...
    tensorfleet.planner.runs.NotAMeshError: The plan's pipeline layout (d=1 t=1 p=4) cannot run on a mesh yet: ...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from tensorfleet.model_parallel.mesh import Mesh
from tensorfleet.planner.layouts import PlanRow

__all__ = ["ENV", "NotAMeshError", "PlannedMesh", "ScriptFailedError", "mesh_spec", "planned_mesh", "run_script"]

ENV = "TENSORFLEET_PLAN_RUN"
"""The environment variable naming the run's spec (JSON) in the process ``tensorfleet plan --run`` starts."""

RULES = "batch:b;hidden:m;heads:m"
_WHY = {
    "data_ps": "parameter servers hold the weights off the devices, which no mesh does (the 'parameter_server' "
               "strategy runs it: tfl.strategies.build('parameter_server'))",
    "pipeline": "a pipeline's stages run one after another, which no mesh layout says "
                "(tensorfleet.model_parallel.pipeline runs pipelines)",
}


class NotAMeshError(ValueError):
    """A plan row the mesh cannot run (a pipeline, parameter servers)."""


class ScriptFailedError(RuntimeError):
    """The script run under the plan's mesh ended with an error of its own (its output says which)."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode


def mesh_spec(row: PlanRow | dict[str, Any]) -> tuple[str, str]:
    """``(mesh_shape, layout_rules)`` of a plan row (or its ``as_dict()``), or :class:`NotAMeshError` saying
    why there is none."""
    strategy, layout = (row.strategy, row.layout) if isinstance(row, PlanRow) else (row["strategy"], row["layout"])
    data, tensor, pipeline = (layout[k] for k in ("data", "tensor", "pipeline"))
    if strategy == "data_ps" or pipeline > 1:
        why = _WHY["data_ps" if strategy == "data_ps" else "pipeline"]
        raise NotAMeshError(f"The plan's {strategy} layout (d={data} t={tensor} p={pipeline}) cannot run on a mesh "
                            f"yet: {why}. Rows a mesh runs: data_allreduce, tensor, hybrid with p=1; ask for one with "
                            f"strategy=... (--run-strategy). Received: strategy={strategy!r}")
    if tensor == 1:
        return f"b:{data}", "batch:b"
    return f"b:{data};m:{tensor}", RULES


class PlannedMesh(Mesh):
    """A plan's mesh (:meth:`tensorfleet.planner.plans.Plan.mesh`): a :class:`Mesh` that keeps each model
    compiled in its scope and the time of each of their training steps, for :meth:`report`.

    Args:
        plan: the :meth:`~tensorfleet.planner.plans.Plan.as_dict` of the plan.
        strategy: the plan row it runs.
        devices: as :class:`Mesh`'s.
    """

    def __init__(self, plan: dict[str, Any], strategy: str, *, devices: Sequence[str] | None = None) -> None:
        self.plan = plan
        self.row = next(r for r in plan["strategies"] if r["strategy"] == strategy)
        shape, rules = mesh_spec(self.row)
        super().__init__(shape, rules, devices=devices, zero=plan["inputs"]["zero"])
        self.models: list[Any] = []
        """The models compiled in :meth:`scope`, in order."""
        self.step_seconds: list[float] = []
        """Each training step's wall time (the first of every ``fit``, which traces, left out)."""
        self.batch_sizes: list[int] = []
        """The ``batch_size`` of each ``fit`` that gave one."""

    @property
    def batch_size(self) -> int:
        """The plan's global batch: the batch a script passes to ``fit`` for a like-for-like step time."""
        return int(self.plan["inputs"]["batch_size"])

    def trainer(self, model: Any) -> Any:
        made = super().trainer(model)  # the mesh's own checks and errors first (ZeRO on Keras 3, ...)
        if not any(m is model for m in self.models):
            self.models.append(model)
            _time_fit(self, model)
        return made

    def report(self) -> Any:
        """What the models compiled in :meth:`scope` hold per device and their median step, beside the plan's
        prediction: a :class:`~tensorfleet.planner.run_report.RunReport`."""
        from tensorfleet.planner.run_report import measure

        if not self.models:
            raise ValueError("Nothing ran on the plan's mesh: build and compile a model inside mesh.scope() and fit "
                             f"it before asking for the report. Received: a mesh {self.layout.mesh_shape!r} with no "
                             "model compiled in its scope")
        return measure(self)


def _time_fit(mesh: PlannedMesh, model: Any) -> None:
    """``model.fit`` (of this object only) with a callback that records each step's wall time in ``mesh``."""
    from tensorfleet.compat.keras import module_of

    base: Any = module_of(model, "the plan's mesh").callbacks.Callback  # a class of a module mypy does not follow

    class StepTimer(base):
        def on_train_begin(self, logs: Any = None) -> None:
            self.first = True

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if not self.first:
                mesh.step_seconds.append(time.perf_counter() - self.start)
            self.first = False

    def fit(*args: Any, **kwargs: Any) -> Any:
        batch = kwargs.get("batch_size", args[2] if len(args) > 2 else None)
        if isinstance(batch, int):
            mesh.batch_sizes.append(batch)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), StepTimer()]
        return type(model).fit(model, *args, **kwargs)

    object.__setattr__(model, "fit", fit)  # the instance's own attribute; Keras' tracking has nothing to keep


_ACTIVE: PlannedMesh | None = None


def planned_mesh(fallback: Mesh | None = None) -> Mesh:
    """The plan's mesh in a script run by ``tensorfleet plan ... --run script.py`` (or
    :meth:`~tensorfleet.planner.plans.Plan.run`): the same :class:`PlannedMesh` each call.

    Args:
        fallback: what to return when no plan runs the script (``python script.py``); without one,
            that is an error.

    Example:
        >>> planned_mesh(fallback=Mesh("b:2", "batch:b")).layout.mesh_shape   # no plan runs this
        'b:2'
    """
    global _ACTIVE
    if _ACTIVE is None and os.environ.get(ENV):
        spec = json.loads(Path(os.environ[ENV]).read_text())
        _ACTIVE = PlannedMesh(spec["plan"], spec["strategy"])
    if _ACTIVE is not None:
        return _ACTIVE
    if fallback is None:
        raise RuntimeError("No plan is running this script: run it with `tensorfleet plan ... --run script.py` (or "
                           "tfl.planner.plan(...).run('script.py')), or give planned_mesh(fallback=Mesh(...)) for "
                           f"runs without a plan. Received: {ENV} not set")
    return fallback


def run_script(plan: dict[str, Any], strategy: str, script: str | os.PathLike[str], args: Sequence[str] = (), *,
               report: str | os.PathLike[str], timeout: float | None = None, processes: int = 1) -> Any:
    """Runs ``script`` (with ``args``) under the plan row ``strategy`` and returns its
    :class:`~tensorfleet.planner.run_report.RunReport`, also written to ``report`` (JSON) and beside it as a
    PNG (predicted against measured, per device). The script's output is this process's.

    With ``processes`` 1, the script runs in one new Python process that holds the plan's devices; with more,
    in that many worker processes of ``tensorfleet launch --mesh`` (127.0.0.1), the mesh spanning them, each
    process holding its share of the devices and measuring those."""
    from tensorfleet.io import check_writable, existing_file, write_json
    from tensorfleet.planner.run_report import RunReport, merge
    from tensorfleet.validation import positive_int

    script = existing_file(script, "script")
    report = check_writable(report)
    processes = positive_int("processes", processes)
    devices = int(plan["inputs"]["devices"])
    if devices % processes:
        raise ValueError(f"The plan's {devices} devices do not split evenly over {processes} processes; give a "
                         f"process count that divides {devices}. Received: processes={processes}")
    mesh_spec(next(r for r in plan["strategies"] if r["strategy"] == strategy))  # refused before starting
    with tempfile.TemporaryDirectory(prefix="tensorfleet-plan-run-") as work:
        spec = Path(work) / "spec.json"
        write_json(spec, {"plan": plan, "strategy": strategy, "measured": str(Path(work) / "measured")})
        returncode = _start(spec, script, args, timeout=timeout, processes=processes)
        if returncode != 0:
            raise ScriptFailedError(f"The script under the plan's mesh failed (exit status {returncode}; its "
                                    f"output is above). Received: script={str(script)!r}, args={list(args)!r}",
                                    returncode)
        parts = [json.loads(p.read_text()) for p in sorted(Path(work).glob("measured*.json"))]
    if len(parts) != processes:
        raise ScriptFailedError(f"{processes - len(parts)} of {processes} processes ended without measuring the "
                                f"plan's mesh. Received: script={str(script)!r}", 1)
    result = merge([RunReport.from_dict(p) for p in parts])
    write_json(report, result.as_dict())
    result.plot(report.with_suffix(".png"))
    return result


def _start(spec: Path, script: Path, args: Sequence[str], *, timeout: float | None, processes: int) -> int:
    """Runs the script under :func:`_child`: in this machine's one process, or as ``launch --mesh`` workers."""
    if processes == 1:
        command = [sys.executable, "-m", "tensorfleet.planner.runs", str(script), *map(str, args)]
        return subprocess.run(command, env={**os.environ, ENV: str(spec)}, timeout=timeout, check=False).returncode
    from tensorfleet.cluster.launch_options import TaskCommand, Timeouts
    from tensorfleet.cluster.launcher import launch

    done = launch(script, [str(a) for a in args], workers=processes, mesh=True, timeouts=Timeouts(timeout=timeout),
                  command=TaskCommand(env={ENV: str(spec)}, runner=("-m", "tensorfleet.planner.runs")), check=False)
    return done.returncode


def _child(argv: list[str]) -> None:
    """``python -m tensorfleet.planner.runs script.py args...`` with :data:`ENV` set: the plan's devices, the
    script run as ``__main__``, then what this process measured written where the spec says."""
    import runpy

    from tensorfleet.io import write_json
    from tensorfleet.model_parallel.mesh.clients import is_multi_client

    spec = json.loads(Path(os.environ[ENV]).read_text())
    client = 0
    if is_multi_client():  # the mesh spans launched processes: the Mesh takes this one's share of the devices
        client = int(os.environ.get("DTENSOR_CLIENT_ID", "0"))
    else:
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            from tensorfleet.strategies.devices import simulate_devices

            simulate_devices(int(spec["plan"]["inputs"]["devices"]))
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)  # as `python script.py`: the script's folder first
    runpy.run_path(argv[0], run_name="__main__")
    if _ACTIVE is None:
        raise SystemExit(f"{argv[0]} never asked for the plan's mesh (tfl.planner.planned_mesh()): nothing ran on "
                         "it to compare with the plan")
    write_json(f"{spec['measured']}-{client}.json", _ACTIVE.report().as_dict())


if __name__ == "__main__":  # run as -m: the package's own module keeps the active mesh, not this __main__ copy
    from tensorfleet.planner.runs import _child as child

    child(sys.argv[1:])
