"""``tensorfleet profile report`` through the CLI entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorfleet.cli.main import main


def test_report_prints_the_table_and_verdict_and_writes_the_files(recorded, tmp_path, capsys):
    logdir, _ = recorded
    assert main(["profile", "report", str(logdir), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["task", "role", "steps", "step", "ms", "compute", "comm", "(overlap)", "input", "idle",
                                "own", "work"]
    assert lines[2].split()[:3] == ["local", "trainer", "9"]
    assert "verdict: input-bound" in lines
    assert any(line.startswith("  change: prefetch: each step waits ") for line in lines)
    assert lines[-1] == (f"wrote {tmp_path / 'profile.json'}, {tmp_path / 'profile.png'} and {tmp_path / 'trace.json'} "
                         f"(open it in ui.perfetto.dev); TensorBoard: tensorboard --logdir {logdir}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json", "profile.png", "trace.json"]


def test_report_json_is_what_the_file_holds(recorded, tmp_path, capsys):
    assert main(["profile", "report", str(recorded[0]), "--out", str(tmp_path), "--json", "--keep-first"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "profile.json").read_text())
    assert printed["verdict"]["bottleneck"] == "input-bound"
    assert [t["steps"] for t in printed["tasks"]] == [10]


def test_report_errors_end_in_one_line(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["profile", "report", str(missing)]) == 2
    assert capsys.readouterr().err == (f"error: No folder at {str(missing)!r}: nothing is there; expected the profile "
                                         "directory a capture wrote.\n")
    assert main(["profile", "report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: No profiler trace (*.xplane.pb) under {str(tmp_path)!r}. Record one "
                                       "with tfl.profiling.capture or ProfileCallback first.\n")
    bad = tmp_path / "worker-0" / "plugins" / "profile" / "2026_01_01_00_00_00" / "vm.xplane.pb"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a protobuf at all")
    assert main(["profile", "report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (err.startswith(f"error: {str(bad)!r} is not a profiler trace (an XSpace .xplane.pb): ")
            and err.count("\n") == 1)


@pytest.mark.slow
def test_report_run_as_users_run_it_prints_nothing_on_stderr(recorded, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
    tensorfleet = str(Path(sys.executable).with_name("tensorfleet"))
    done = subprocess.run([tensorfleet, "profile", "report", str(recorded[0]), "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("task ")
    assert done.stderr == ""


def test_report_needs_the_link_with_the_model(recorded, capsys):
    assert main(["profile", "report", str(recorded[0]), "--params", "1M"]) == 2
    assert capsys.readouterr().err == ("error: --params and --bandwidth go together: the planner needs the model and "
                                       "the link. Received: --params='1M', --bandwidth=None\n")
