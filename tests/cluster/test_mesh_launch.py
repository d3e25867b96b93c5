"""``launch(mesh=True)`` / ``tensorfleet launch --mesh``: the workers' DTensor environment from their TF_CONFIG,
and the options that do not fit a mesh across processes refused before anything starts."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tensorfleet.cli.main import main
from tensorfleet.cluster.launcher import TaskCommand, TaskOutput, Timeouts, launch
from tensorfleet.model_parallel.mesh.clients import env_from_tf_config, local_share

#: What a task of a mesh job sees: the mesh's environment, made into DTensor's as the Mesh does it.
TASK = textwrap.dedent("""
    import json, os
    from tensorfleet.model_parallel.mesh.clients import is_multi_client
    assert is_multi_client()
    print("ENV " + json.dumps({k: v for k, v in os.environ.items() if k.startswith("DTENSOR_")}))
""")


@pytest.fixture
def task_script(tmp_path: Path) -> Path:
    path = tmp_path / "task.py"
    path.write_text(TASK)
    return path


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_each_worker_is_a_dtensor_client_at_its_tf_config_port(task_script: Path, monkeypatch) -> None:
    monkeypatch.setenv("DTENSOR_JOBS", "10.0.0.1:1")  # the shell's own: not the tasks'
    result = launch(task_script, workers=3, mesh=True, output=TaskOutput(log=None), timeouts=Timeouts(timeout=100),
                    command=TaskCommand(python=sys.executable))
    assert result.returncode == 0, result.error
    workers = result.cluster.as_dict()["worker"]
    envs = {line.task: json.loads(line.text[4:]) for line in result.lines if line.text.startswith("ENV ")}
    assert envs == {f"worker:{i}": {"DTENSOR_JOBS": ",".join(workers), "DTENSOR_CLIENT_ID": str(i),
                                    "DTENSOR_NUM_CLIENTS": "3", "DTENSOR_JOB_NAME": "worker"} for i in range(3)}


@pytest.mark.parametrize(("extra", "message"), [
    ({"ps": 1}, "drop the ps. Received: ps=1"),
    ({"chief": True}, "drop the chief. Received: chief=1"),
    ({"evaluator": True}, "drop the evaluator. Received: evaluator=1"),
    ({"command": TaskCommand(env={"DTENSOR_CLIENT_ID": "0"})}, "Received: DTENSOR_CLIENT_ID"),
])
def test_a_mesh_job_refuses_tasks_other_than_workers(task_script: Path, extra, message) -> None:
    with pytest.raises(ValueError, match="mesh") as raised:
        launch(task_script, workers=2, mesh=True, output=TaskOutput(log=None), **extra)
    assert str(raised.value).endswith(message)


def test_the_command_takes_mesh_in_the_plain_mode_only(task_script: Path, tmp_path: Path, capsys) -> None:
    assert main(["launch", "--checkpoint-dir", str(tmp_path / "ck"), "--mesh", str(task_script)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: --mesh does not apply to a migratable job (--strategy, --checkpoint-dir or --resume-from): "
                   "its placement decides the devices (--strategy mesh: a mesh in one process). It applies to a "
                   "script (plain launch). Received: --mesh")
    assert main(["launch", "--mesh", "--ps", "1", str(task_script)]) == 2
    assert "drop the ps. Received: ps=1" in capsys.readouterr().err


def test_tf_config_of_a_chief_or_none_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="TF_CONFIG does not name them .* Received: TF_CONFIG=''"):
        env_from_tf_config("")
    chief = {"cluster": {"worker": ["h:1"], "chief": ["h:2"]}, "task": {"type": "chief", "index": 0}}
    with pytest.raises(ValueError, match=r"workers only .* TF_CONFIG names chief. Received: task chief:0"):
        env_from_tf_config(json.dumps(chief))


def test_a_mesh_the_processes_do_not_divide_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("DTENSOR_JOBS", "h:1,h:2,h:3")
    assert local_share(6, "b:3;m:2") == 2
    with pytest.raises(ValueError, match=r"across 3 processes .* Received: mesh_shape='b:2;m:2' of 4 devices"):
        local_share(4, "b:2;m:2")


def test_only_the_dtensor_backend_spans_processes(monkeypatch) -> None:
    from tensorfleet.model_parallel.mesh import Mesh

    monkeypatch.setenv("DTENSOR_JOBS", "h:1,h:2")
    with pytest.raises(ValueError, match=r"mtf and keras backends .* Received: backend='mtf'"):
        Mesh("b:2;m:2", "batch:b", backend="mtf").devices


def test_a_tfjob_with_the_mesh_variable_gives_each_pod_its_dtensor_environment() -> None:
    """On Kubernetes the operator sets TF_CONFIG; ``--env TENSORFLEET_MESH_ACROSS_PROCESSES=1`` makes its workers
    the mesh's processes, as ``launch --mesh`` does locally."""
    from tensorfleet.cluster import k8s
    from tensorfleet.model_parallel.mesh.clients import ENV_ACROSS

    docs = k8s.tfjob(name="mesh", image="img:1", command=["python", "train.py"], workers=2, env={ENV_ACROSS: "1"})
    assert env_from_tf_config(json.dumps(k8s.pod_tf_config(docs, "worker", 1))) == {
        "DTENSOR_JOBS": "mesh-worker-0.default.svc:2222,mesh-worker-1.default.svc:2222", "DTENSOR_CLIENT_ID": "1",
        "DTENSOR_NUM_CLIENTS": "2", "DTENSOR_JOB_NAME": "worker"}
