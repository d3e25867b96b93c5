"""Interpreters the launcher starts for tensorfleet's own modules cannot be shadowed by files in
the working directory; user scripts keep their own directory importable, as Python gives it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import portpicker
import pytest

from tensorfleet.cluster.contract import SERVE_ARGS
from tensorfleet.cluster.launcher import TaskOutput, launch
from tensorfleet.cluster.processes import JobMode, LocalJob
from tensorfleet.strategies.tf_config import ClusterSpec
from tests.conftest import reap

SHADOW = 'raise SystemExit("bisect.py in the working directory shadowed the standard library")\n'


@pytest.fixture
def shadowing_cwd(tmp_path: Path, monkeypatch) -> Path:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "bisect.py").write_text(SHADOW)
    monkeypatch.chdir(cwd)
    return cwd


@pytest.mark.slow
def test_a_ps_jobs_server_task_starts_despite_a_stdlib_named_file_in_the_working_directory(
        shadowing_cwd: Path) -> None:
    spec = ClusterSpec.local(workers=1, ps=1, chief=True)
    job = LocalJob(spec=spec, mode=JobMode.PARAMETER_SERVER, argv=[], env={}, log=None, stop_when=None)
    argv = job.task_argv("ps")
    assert argv == [sys.executable, *SERVE_ARGS] and SERVE_ARGS[0] == "-P"
    env = {"TF_CONFIG": json.dumps(spec.tf_config("ps", 0)), "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, cwd=shadowing_cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline, lines = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if "serving at" in line:
                break
        assert lines[-1] == f"tensorfleet: ps:0 serving at {spec.task('ps', 0).address}", lines
    finally:
        reap(proc)


@pytest.mark.slow
def test_a_launched_script_imports_from_its_own_directory_not_the_working_one(tmp_path: Path,
                                                                               shadowing_cwd: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "helper.py").write_text("GREETING = 'hello from the script directory'\n")
    (scripts / "train.py").write_text("import bisect, helper\nprint(helper.GREETING, bisect.bisect([1, 3], 2))\n")
    result = launch(scripts / "train.py", workers=1, output=TaskOutput(log=None),
                    ports=[portpicker.pick_unused_port()])
    assert result.returncode == 0
    assert [line.text for line in result.lines] == ["hello from the script directory 1"]
