"""The supervision state machine's decisions, without processes: what a failure restarts, when the
restart limit ends the job, and the backoff between restarts."""

from __future__ import annotations

import pytest

from tensorfleet.cluster.contract import HUNG_STATUS
from tensorfleet.cluster.processes import JobMode, LocalJob
from tensorfleet.cluster.supervisor import JobState, Supervisor, TaskFailure
from tensorfleet.strategies.tf_config import ClusterSpec


def _supervisor(mode: JobMode, *, max_restarts: int = 3, backoff: float = 1.0, max_backoff: float = 30.0,
                restarts: int = 0) -> Supervisor:
    spec = ClusterSpec.local(workers=2, ps=1 if mode is JobMode.PARAMETER_SERVER else 0, chief=True,
                             ports=[1, 2, 3, 4][:3 + (mode is JobMode.PARAMETER_SERVER)])
    job = LocalJob(spec=spec, mode=mode, argv=[], env={}, log=None, stop_when=None)  # no process starts
    supervisor = Supervisor(job, max_restarts=max_restarts, backoff=backoff, max_backoff=max_backoff, timeout=None,
                            hang_timeout=None, grace=0.0, received=[])
    supervisor.restarts = restarts
    return supervisor


@pytest.mark.parametrize(("mode", "task", "code", "expected"), [
    (JobMode.COLLECTIVE, "worker:1", 1, JobState.RESTARTING_JOB),
    (JobMode.PARAMETER_SERVER, "worker:1", -9, JobState.RESTARTING_TASK),
    (JobMode.PARAMETER_SERVER, "worker:1", HUNG_STATUS, JobState.RESTARTING_JOB),  # hung: all tasks again
    (JobMode.PARAMETER_SERVER, "ps:0", -9, JobState.RESTARTING_JOB),
    (JobMode.PARAMETER_SERVER, "chief:0", 1, JobState.RESTARTING_JOB),
])
def test_only_a_failed_worker_of_a_parameter_server_job_is_restarted_alone(mode, task, code, expected) -> None:
    supervisor = _supervisor(mode)
    supervisor.failure = TaskFailure(task, code, f"{task} failed")
    assert supervisor.on_failure() is expected
    assert supervisor.restarts == 1


def test_the_restart_limit_gives_up_without_counting_a_restart() -> None:
    supervisor = _supervisor(JobMode.COLLECTIVE, max_restarts=2, restarts=2)
    supervisor.failure = TaskFailure("worker:1", 3, "worker:1 exited with status 3")
    assert supervisor.on_failure() is JobState.GIVING_UP
    assert supervisor.restarts == 2


@pytest.mark.parametrize(("restarts", "delay"), [(1, 0.5), (2, 1.0), (3, 2.0), (6, 10.0)])
def test_backoff_doubles_per_restart_up_to_max_backoff(restarts: int, delay: float) -> None:
    supervisor = _supervisor(JobMode.COLLECTIVE, backoff=0.5, max_backoff=10.0, restarts=restarts)
    assert supervisor.restart_delay() == delay


def test_every_state_has_a_step() -> None:
    assert set(_supervisor(JobMode.COLLECTIVE).steps) == set(JobState)
