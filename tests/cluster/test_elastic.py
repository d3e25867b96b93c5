"""Elastic restarts: the batch-size policy, and a real job stopped at 2 workers that continues
at 1 and back at 2 from the same backup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorfleet.cluster import elastic
from tensorfleet.cluster.contract import ENV_BATCH_POLICY
from tensorfleet.cluster.elastic import BatchPolicy, BatchSizes, ElasticPhase, batch_sizes, launch_elastic
from tensorfleet.cluster.fault_tolerance import resumed_epoch
from tensorfleet.cluster.launch_options import Timeouts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("replicas", "expected"), [(1, (64, 64)), (2, (64, 32)), (4, (64, 16))])
def test_keep_global_splits_the_same_global_batch(replicas: int, expected: tuple[int, int]) -> None:
    assert batch_sizes(replicas, policy="keep_global", global_batch_size=64) == BatchSizes(*expected, replicas)


@pytest.mark.parametrize(("replicas", "expected"), [(1, (32, 32)), (2, (64, 32)), (3, (96, 32))])
def test_keep_per_replica_scales_the_global_batch(replicas: int, expected: tuple[int, int]) -> None:
    sizes = batch_sizes(replicas, policy=BatchPolicy.KEEP_PER_REPLICA, per_replica_batch_size=32)
    assert sizes == BatchSizes(*expected, replicas)


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((3,), {"policy": "keep_global", "global_batch_size": 64},
     "global_batch_size must be divisible by the number of replicas under 'keep_global'. "
     "Received: global_batch_size=64, replicas=3"),
    ((2,), {"policy": "keep_global"}, "policy='keep_global' needs global_batch_size. Received: global_batch_size=None"),
    ((2,), {"policy": "keep_per_replica"},
     "policy='keep_per_replica' needs per_replica_batch_size. Received: per_replica_batch_size=None"),
    ((2,), {"policy": "linear", "global_batch_size": 64},
     "policy must be one of 'keep_global', 'keep_per_replica'. Received: policy='linear'"),
    ((0,), {"global_batch_size": 64}, "replicas must be a positive integer. Received: replicas=0"),
    ((2,), {"global_batch_size": -8}, "global_batch_size must be a positive integer. Received: global_batch_size=-8"),
])
def test_bad_batch_arguments_are_clear_errors(args, kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        batch_sizes(*args, **kwargs)
    assert str(info.value) == message


def test_policy_from_env(monkeypatch) -> None:
    monkeypatch.delenv(ENV_BATCH_POLICY, raising=False)
    assert elastic.policy_from_env() is BatchPolicy.KEEP_GLOBAL
    monkeypatch.setenv(ENV_BATCH_POLICY, "keep_per_replica")
    assert elastic.policy_from_env() is BatchPolicy.KEEP_PER_REPLICA


@pytest.mark.parametrize(("phases", "error", "message"), [
    ([], ValueError, "phases must list at least one ElasticPhase. Received: phases=[]"),
    ([ElasticPhase(2, 2), ElasticPhase(1, 2)], ValueError,
     "phases must end at increasing epochs. Received: phases[1].until_epoch=2 after 2"),
    ([ElasticPhase(2), ElasticPhase(1, 4)], ValueError,
     "Only the last phase may run to the end (until_epoch=None). Received: phases[0]"),
    ([ElasticPhase(0, 2)], ValueError, "phases[0].workers must be a positive integer. Received: phases[0].workers=0"),
    ([(2, 2)], TypeError, "phases[0] must be an ElasticPhase. Received: (2, 2)"),
])
def test_bad_schedules_are_clear_errors(tmp_path: Path, phases, error, message) -> None:
    with pytest.raises(error) as info:
        launch_elastic(EXAMPLES / "train_digits_multiworker.py", phases=phases, backup_dir=tmp_path)
    assert str(info.value) == message


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_job_stopped_at_2_workers_continues_at_1_and_back_at_2_from_the_same_backup(tmp_path: Path) -> None:
    epochs, examples = 6, 256
    results = launch_elastic(
        EXAMPLES / "train_digits_multiworker.py",
        ["--model", "digits_mlp", "--epochs", str(epochs), "--examples-per-epoch", str(examples),
         "--per-replica-batch-size", "32"],
        phases=[ElasticPhase(workers=2, until_epoch=2), ElasticPhase(workers=1, until_epoch=4),
                ElasticPhase(workers=2)],
        backup_dir=tmp_path / "backup", policy="keep_per_replica", timeouts=Timeouts(timeout=150))
    assert [(r.stopped, r.returncode, r.cluster.num_tasks()) for r in results] == [
        (True, 0, 2), (True, 0, 1), (False, 0, 2)]

    def chief(i: int) -> list[str]:
        return results[i].output("worker:0")

    def ended(lines: list[str]) -> list[int]:
        return [int(m.group(1)) for line in lines if (m := re.match(r"tensorfleet: epoch (\d)/6 end", line))]

    # keep_per_replica: each replica keeps 32 examples, the global batch follows the job's size.
    assert "tensorfleet: replicas=2 policy=keep_per_replica global_batch=64 per_replica_batch=32" in chief(0)
    assert "tensorfleet: replicas=1 policy=keep_per_replica global_batch=32 per_replica_batch=32" in chief(1)
    assert "tensorfleet: replicas=2 policy=keep_per_replica global_batch=64 per_replica_batch=32" in chief(2)
    assert resumed_epoch(chief(0)) is None and ended(chief(0)) == [1, 2]
    assert resumed_epoch(chief(1)) == 3 and ended(chief(1)) == [3, 4]
    assert resumed_epoch(chief(2)) == 5 and ended(chief(2)) == [5, 6]
    assert "tensorfleet: stopping after epoch 2 as planned" in results[0].output("worker:1")
    assert "tensorfleet: stopping after epoch 4 as planned" in chief(1)
    assert results[0].events[-1].text == "the job stopped as planned (worker:0, worker:1 exited with status 75)"
    # Steps: 256/64 per epoch at 2 workers, 256/32 at 1: 2*4 + 2*8 + 2*4 optimizer steps in all.
    done = next(line for line in chief(2) if line.startswith("tensorfleet: done"))
    assert re.search(r"iterations=(\d+)", done).group(1) == "32"
    accuracy = [float(m.group(1))
                for line in chief(2) if (m := re.search(r"epoch 6/6 end.* val_accuracy=([\d.]+)", line))]
    assert accuracy and accuracy[0] > 0.8
