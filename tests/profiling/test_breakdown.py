"""The step arithmetic and the verdicts, on numbers alone."""

from __future__ import annotations

import pytest

from tensorfleet.profiling.breakdown import Bottleneck, TaskSummary, break_down_step, judge
from tensorfleet.profiling.intervals import intersect, length, subtract, union
from tensorfleet.profiling.xspace import DeviceSpans, Step


def test_interval_arithmetic():
    a = union([(5, 7), (0, 2), (1, 3), (9, 9), (8, 6)])
    assert a == [(0, 3), (5, 7)]
    assert intersect(a, [(2, 6), (6.5, 10)]) == [(2, 3), (5, 6), (6.5, 7)]
    assert subtract(a, [(1, 2), (4, 5.5), (6, 8)]) == [(0, 1), (2, 3), (5.5, 6)]
    assert subtract(a, []) == a and intersect(a, []) == [] and length(a) == 5


def test_spans_outside_the_step_are_cut_off_and_the_parts_add_up():
    spans = DeviceSpans(compute=[(-5, 2), (8, 30)], communication=[(1, 4)], input=[(3, 6)])
    row = break_down_step("worker-0", "/host:CPU", Step(1, 0, 10), spans)
    assert (row.step_ms, row.compute_ms, row.exposed_communication_ms, row.input_ms, row.idle_ms) == (10, 4, 2, 2, 2)
    assert (row.communication_ms, row.overlap_ms, row.collectives, row.own_work_ms) == (3, 1, 1, 8)


def _task(name: str, *, compute: float = 0.0, comm: float = 0.0, input_: float = 0.0, idle: float = 0.0,
          collectives: float = 2.0) -> TaskSummary:
    step = compute + comm + input_ + idle
    return TaskSummary(task=name, steps=5, step_ms=step, compute_ms=compute, exposed_communication_ms=comm,
                       input_ms=input_, idle_ms=idle, communication_ms=comm, overlap=0.0, collectives=collectives,
                       own_work_ms=step - comm)


def test_the_largest_part_decides_and_names_its_change():
    verdict = judge([_task("w0", compute=10, comm=30, idle=5), _task("w1", compute=10, comm=30, idle=5)])
    assert verdict.bottleneck is Bottleneck.COMMUNICATION and verdict.straggler is None
    assert verdict.reason == ("per step of 45.0 ms: input 0.0 ms (0%), exposed communication 30.0 ms (67%), "
                              "compute 10.0 ms (22%), idle 5.0 ms (11%)")
    assert verdict.advice.startswith("larger per-replica batch: communication (30.0 ms)")
    many = judge([_task("w0", compute=10, comm=30, collectives=40), _task("w1", compute=10, comm=30, collectives=40)])
    assert many.advice.startswith("another cross-device op: 40 collectives per step are latency-bound")
    assert judge([_task("w0", compute=30, input_=5)]).bottleneck is Bottleneck.COMPUTE
    assert judge([_task("w0", compute=30, input_=5)]).advice.startswith("more replicas")
    host_bound = judge([_task("w0", compute=5, idle=20)])
    assert (host_bound.bottleneck is Bottleneck.COMPUTE
            and host_bound.advice.startswith("larger per-replica batch: 20.0"))
    assert judge([_task("w0", compute=5, input_=20)]).advice.startswith("prefetch: each step waits 20.0 ms")


def test_a_task_whose_own_work_exceeds_the_others_by_a_quarter_of_the_step_is_the_straggler():
    healthy, slow = _task("worker-0", compute=10, comm=20), _task("worker-1", compute=30)
    verdict = judge([healthy, slow])
    assert (verdict.bottleneck, verdict.straggler) == (Bottleneck.STRAGGLER, "worker-1")
    assert verdict.reason == ("worker-1's own work is 30.0 ms per step against 10.0 ms on worker-0 (67% of the "
                              "30.0 ms step); most of it compute (30.0 ms)")
    # 20% of the step apart: not a straggler, the parts decide
    assert judge([_task("a", compute=20, comm=5), _task("b", compute=25)]).bottleneck is Bottleneck.COMPUTE
    with pytest.raises(ValueError, match="^No steps to judge"):
        judge([])


def test_a_parameter_server_job_is_judged_from_its_workers_with_the_ps_per_step_served(tmp_path):
    from tensorfleet.profiling.breakdown import TaskRole, analyze
    from tensorfleet.profiling.xspace import StepSource, TaskTrace

    host = "/host:CPU"
    worker = TaskTrace("worker-0", tmp_path, "vm", [Step(0, 0, 10), Step(1, 10, 20), Step(2, 20, 30)],
                       {host: DeviceSpans(compute=[(11, 13), (21, 23)], communication=[(13, 14), (23, 24)],
                                          input=[(10, 11), (20, 21)])}, StepSource.FUNCTION)
    idle_worker = TaskTrace("worker-1", tmp_path, "vm", [], {host: DeviceSpans()}, StepSource.NONE)
    ps = TaskTrace("ps-0", tmp_path, "vm", [], {host: DeviceSpans(compute=[(12, 13), (22, 24)],
                                                                   communication=[(14, 15)])}, StepSource.NONE, 2)
    chief = TaskTrace("chief-0", tmp_path, "vm", [Step(5, 0, 1), Step(6, 10, 11), Step(7, 20, 21)],
                      {host: DeviceSpans()})
    profile = analyze([chief, ps, worker, idle_worker])
    tasks = {t.task: t for t in profile.tasks}
    assert {name: t.role for name, t in tasks.items()} == {
        "chief-0": TaskRole.COORDINATOR, "ps-0": TaskRole.PS, "worker-0": TaskRole.WORKER,
        "worker-1": TaskRole.WORKER}
    # A worker's step: its ops 2 ms, its input wait 1 ms, the rest (7 ms) waiting for the ps.
    w = tasks["worker-0"]
    assert (w.steps, w.step_ms, w.compute_ms, w.exposed_communication_ms, w.input_ms, w.idle_ms) == (2, 10, 2, 7, 1, 0)
    # The ps's span 12-24 ms per each of the 2 steps it served: 3 ms of updates, 1 ms sending, 8 ms waiting.
    p = tasks["ps-0"]
    assert (p.steps, p.step_ms, p.compute_ms, p.exposed_communication_ms, p.idle_ms) == (2, 6, 1.5, 0.5, 4)
    assert (tasks["worker-1"].steps, tasks["chief-0"].steps, tasks["chief-0"].idle_ms) == (0, 2, 1)
    verdict = profile.verdict
    assert verdict.bottleneck is Bottleneck.COMMUNICATION and verdict.straggler is None
    assert verdict.advice == ("larger per-worker batch: each step waits 7.0 ms for the ps tasks (variable reads, "
                              "gradient updates), the same whatever the batch; the busiest ps task, ps-0, is busy "
                              "only 33% of the time")


def test_a_busy_ps_task_turns_the_advice_to_more_ps_tasks(tmp_path):
    from tensorfleet.profiling.breakdown import analyze
    from tensorfleet.profiling.xspace import StepSource, TaskTrace

    host = "/host:CPU"
    worker = TaskTrace("worker-0", tmp_path, "vm", [Step(0, 0, 10), Step(1, 10, 20)],
                       {host: DeviceSpans(compute=[(11, 12)])}, StepSource.FUNCTION)
    ps = TaskTrace("ps-0", tmp_path, "vm", [], {host: DeviceSpans(compute=[(0, 9), (10, 16)],
                                                                   communication=[(9, 10)])}, StepSource.NONE, 2)
    verdict = analyze([worker, ps]).verdict
    assert verdict.bottleneck is Bottleneck.COMMUNICATION
    assert verdict.advice == ("more ps tasks: ps-0 is busy 100% of the time serving the workers' variable reads and "
                              "updates; more ps tasks share the variables (and that work) between them")
