"""A mesh across processes: ``tensorfleet launch --workers 2 --mesh`` runs one script as two DTensor clients of
one ``Mesh("b:2;m:2")`` (each process two logical CPUs, one row of ``b``); the model with a skip connection and
LayerNormalization and a small GPT train with Adam and Keras 3's own ``fit`` equal to one device. The same
tf_keras and ZeRO stages 1-3 across the processes: each device holds its share, weights equal to one device. The
same kind of script in one process and in two ends with the same weights: docs/how-to-run-a-mesh-across-processes.md
(run by tests/test_docs.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import collect_workers, user_env

JOB = Path(__file__).with_name("mesh_processes_job.py")
RESUME_JOB = Path(__file__).with_name("mesh_resume_job.py")


def _results(log: str) -> dict[str, dict]:
    """Each task's RESULT line (``[worker:i] RESULT {...}``) by task."""
    found = {}
    for line in log.splitlines():
        head, _, rest = line.partition("RESULT ")
        if rest:
            out = json.loads(rest)
            found[out["task"]] = out
    return found


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_processes_form_one_2x2_mesh_and_fit_equals_one_device(keras3) -> None:
    launcher = [sys.executable, "-m", "tensorfleet.cli.main", "launch", "--workers", "2", "--mesh", str(JOB)]
    procs, logs = collect_workers([launcher], [user_env(TF_CPP_MIN_LOG_LEVEL="3")], timeout=400)
    assert procs[0].returncode == 0, logs[0][-4000:]
    results = _results(logs[0])
    assert sorted(results) == ["worker:0", "worker:1"], logs[0][-3000:]
    for task, out in results.items():
        # one mesh of 4 devices, 2 in each process, in mesh order
        assert out["devices"] == [f"/job:worker/replica:0/task:{t}/device:CPU:{d}" for t in (0, 1) for d in (0, 1)]
        # d1/kernel (512, 16) split over m: each process holds its two devices' shards (one row of b)
        assert out["skip_net"]["local_shards"] == [[512, 8], [512, 8]]
        assert out["gpt"]["local_shards"] == [[16, 16], [16, 16]]
        for name in ("skip_net", "gpt"):
            run = out[name]
            assert len(run["steps"]) == 4 and run["moved"] > 1e-2, (task, run)
            # measured: 3.5e-6 (skip_net d1/kernel), 1.0e-6 (gpt up/kernel); the key bias's true gradient is 0,
            # Adam scales its rounding noise (test_mesh_keras3.py), here 5.9e-7
            assert max(run["weight_diff"].values()) < 1e-5, (task, name, run["weight_diff"])
        evaluated, reference = out["skip_net"]["evaluate"]
        assert abs(evaluated - reference) < 1e-5, out["skip_net"]["evaluate"]  # measured: equal
        assert out["skip_net"]["predict_diff"] < 1e-5  # measured: 6.3e-7
        assert out["skip_net"]["loaded_diff"] < 1e-6  # the .keras file one device loads: the gathered weights
        # tf_keras under ZeRO: each device holds what it holds in one process (test_mesh_zero.py), the
        # stage's split over b now across the processes. Elements per device: embed 16x8, h 32x16 [-,m] + 16 [m],
        # ln 2x16, o 16x8 [-,m] + 8 [m]; ZeRO splits each over b on its first whole axis (not the m-split biases).
        whole, split = 128 + 256 + 8 + 32 + 64 + 4, 64 + 128 + 8 + 16 + 32 + 4
        mine = [f"/job:worker/replica:0/task:{task[-1]}/device:CPU:{d}" for d in (0, 1)]
        stages = [out[f"zero{zero}"] for zero in range(4)]
        assert [row["parameters"] for row in stages] == [dict.fromkeys(mine, whole)] * 3 + [dict.fromkeys(mine, split)]
        assert [row["optimizer_state"] for row in stages] == ([dict.fromkeys(mine, 2 * whole + 1)]
                                                              + [dict.fromkeys(mine, 2 * split + 1)] * 3)
        # measured: 2.4e-7 (stages 0-2), 2.6e-7 (stage 3)
        assert max(row["weight_diff"] for row in stages) < 1e-5, stages
        # "m:2;b:2": m across the processes, each replica over both (whole batches, split as read): measured 3.5e-6
        assert out["model_across"] < 1e-5, out["model_across"]
    # both processes ran one program: the same losses at every step
    assert results["worker:0"]["skip_net"]["steps"] == results["worker:1"]["skip_net"]["steps"]
    assert results["worker:0"]["gpt"]["steps"] == results["worker:1"]["gpt"]["steps"]



@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_killed_process_restarts_the_mesh_from_its_last_backup(keras3, tmp_path: Path, monkeypatch) -> None:
    """kill -9 of worker:1 once worker:0 has backed up epoch 2 of 3: the launcher restarts both processes, they
    resume at epoch 3 from the first process's backup and end with the weights of one device's uninterrupted run."""
    from tensorfleet import testing
    from tensorfleet.cluster.launcher import Recovery, TaskOutput, Timeouts, launch
    from tensorfleet.testing import Fault

    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)  # the tasks are a user's processes
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    with testing.faults(Fault(task="worker:1", when=r"epoch 2/3 end", watch="worker:0")):
        result = launch(RESUME_JOB, workers=2, mesh=True, check=False, output=TaskOutput(log=None),
                        recovery=Recovery(max_restarts=1, backoff=0, backup_dir=tmp_path / "backup"),
                        timeouts=Timeouts(timeout=150))
    text = [f"[{line.task}] {line.text}" for line in result.lines]
    assert result.returncode == 0 and result.restarts == 1, (result.error, text[-40:])
    resumed = [line for line in text if "resumed from backup at epoch" in line]
    assert sorted(resumed) == [f"[worker:{i}] tensorfleet: resumed from backup at epoch 3" for i in (0, 1)]
    results = {out["task"]: out for out in (json.loads(line.text[7:]) for line in result.lines
                                            if line.text.startswith("RESULT "))}
    assert sorted(results) == ["worker:0", "worker:1"], text[-40:]
    for out in results.values():
        assert out["attempt"] == 1
        assert out["weight_diff"] < 1e-5, out  # measured: 1.2e-7
