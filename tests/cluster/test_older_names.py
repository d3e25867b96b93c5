"""The cluster room's older keywords (docs/glossary.md, "Older names") keep working for one release: ``directory``
is ``out_dir``, ``sink`` is ``log``, ``quiet`` is ``not verbose``. Each warns naming the new word; both at once is a
ValueError. No process starts: every call ends where it would launch, or is a pure function."""

from __future__ import annotations

import json
import warnings
from dataclasses import fields
from pathlib import Path

import pytest

from tensorfleet.cluster import jobstate
from tensorfleet.cluster.contract import ENV_MIGRATION
from tensorfleet.cluster.elastic import launch_elastic
from tensorfleet.cluster.jobstate import CheckpointError
from tensorfleet.cluster.launch_options import TaskOutput
from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions, TaskOptions, check_migration, migrate
from tensorfleet.cluster.multiplex import SharedJob, share
from tensorfleet.cluster.processes import JobMode, LocalJob
from tensorfleet.strategies.tf_config import ClusterSpec

LATER = "; the older name will stop working in the next release."


def _warns(where: str, old: str, new: str):
    return pytest.warns(DeprecationWarning, match=f"^{where}: '{old}' is now '{new}'{LATER}$")


def _no_checkpoint(path: Path) -> str:
    return f"^No migration checkpoint to resume from in '{path}': it has no latest.json"


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text("")  # never read: every call here stops before the job is loaded
    return path


def test_migrate_takes_directory_sink_and_quiet(job: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with _warns("migrate", "directory", "out_dir"), pytest.raises(CheckpointError, match=_no_checkpoint(ckpt)):
        migrate(job, directory=ckpt, to=Placement("mirrored"), resume=True)  # the value reaches read_state
    for old, new, value in (("sink", "log", print), ("quiet", "verbose", False)):
        with _warns("migrate", old, new), pytest.raises(CheckpointError, match=_no_checkpoint(ckpt)):
            migrate(job, ckpt, to=Placement("mirrored"), resume=True, **{old: value})
    with pytest.raises(ValueError, match=r"^migrate: 'sink' is the older name of 'log'; give one of them\. "
                                         r"Received: sink=<built-in function print>, log=<built-in function len>$"), \
            pytest.warns(DeprecationWarning):
        migrate(job, ckpt, to=Placement("mirrored"), sink=print, log=len)
    with pytest.raises(ValueError, match=r"^migrate: 'directory' is the older name of 'out_dir'"), \
            pytest.warns(DeprecationWarning):
        migrate(job, out_dir=ckpt, directory=tmp_path / "other", to=Placement("mirrored"))


def test_check_migration_and_the_job_state_functions_take_directory(tmp_path: Path) -> None:
    with _warns("check_migration", "directory", "out_dir"), \
            pytest.raises(CheckpointError, match=_no_checkpoint(tmp_path)):
        check_migration(directory=tmp_path, to=Placement("mirrored"), run=RunOptions())
    with _warns("read_state", "directory", "out_dir"), pytest.raises(CheckpointError, match=_no_checkpoint(tmp_path)):
        jobstate.read_state(directory=tmp_path)
    with _warns("latest", "directory", "out_dir"):
        assert jobstate.latest(directory=tmp_path) is None
    with _warns("step_directory", "directory", "out_dir"):
        assert jobstate.step_directory(directory="ckpt", step=12) == Path("ckpt/step-00000012")
    with pytest.raises(ValueError, match=r"^latest: 'directory' is the older name of 'out_dir'; give one of them"), \
            pytest.warns(DeprecationWarning):
        jobstate.latest(out_dir=tmp_path, directory=tmp_path)
    for function in (jobstate.check_same_keras, jobstate.write_checkpoint):  # these need a model or a checkpoint
        assert function.__renamed__ == {"directory": "out_dir"}


def test_share_and_launch_elastic_take_sink() -> None:
    with _warns("share", "sink", "log"), \
            pytest.raises(MigrationError, match=r"^Sharing devices needs at least two jobs\. Received: 0 job\(s\)$"):
        share([], sink=print)  # refused before anything starts
    with _warns("launch_elastic", "sink", "log"), \
            pytest.raises(ValueError, match=r"^phases must list at least one ElasticPhase\. Received: phases=\[\]$"):
        launch_elastic("train.py", phases=[], backup_dir="backup", sink=print)
    with pytest.raises(ValueError, match=r"^share: 'sink' is the older name of 'log'"), \
            pytest.warns(DeprecationWarning):
        share([], sink=print, log=print)


def test_task_output_takes_sink_and_quiet_and_reads_them() -> None:
    lines: list[str] = []
    with _warns("TaskOutput.__init__", "sink", "log"):
        assert TaskOutput(sink=lines.append).log == lines.append
    with _warns("TaskOutput.__init__", "quiet", "verbose"):
        assert TaskOutput(quiet=False).verbose is True
    with _warns("TaskOutput.__init__", "quiet", "verbose"):
        assert TaskOutput(quiet=True).verbose is False
    assert TaskOutput().verbose is False  # the older default, quiet=True
    output = TaskOutput(log=None, verbose=True)
    with pytest.warns(DeprecationWarning, match=f"^TaskOutput.sink is now TaskOutput.log{LATER}$"):
        assert output.sink is None
    with pytest.warns(DeprecationWarning, match=f"^TaskOutput.quiet is now TaskOutput.verbose{LATER}$"):
        assert output.quiet is False
    with pytest.raises(ValueError, match=r"^TaskOutput.__init__: 'quiet' is the older name of 'verbose'; give one "
                                         r"of them\. Received: quiet=True, verbose=True$"), \
            pytest.warns(DeprecationWarning):
        TaskOutput(quiet=True, verbose=True)


def test_local_job_takes_sink_and_quiet() -> None:
    spec = ClusterSpec.local(workers=2, ports=[1, 2])
    lines: list[str] = []
    with _warns("LocalJob.__init__", "sink", "log"), _warns("LocalJob.__init__", "quiet", "verbose"):
        job = LocalJob(spec=spec, mode=JobMode.COLLECTIVE, argv=[], env={}, sink=lines.append, stop_when=None,
                       quiet=False)  # no process starts
    assert (job.log, job.verbose) == (lines.append, True)
    job.event("hello")
    assert lines == ["[launcher] hello"]


def test_shared_job_takes_directory() -> None:
    with _warns("SharedJob.__init__", "directory", "out_dir"):
        shared = SharedJob("a.py", directory="ckpt-a", to=Placement("mirrored"))
    assert shared == SharedJob("a.py", "ckpt-a", Placement("mirrored"))
    with pytest.warns(DeprecationWarning, match=f"^SharedJob.directory is now SharedJob.out_dir{LATER}$"):
        assert shared.directory == "ckpt-a"


def test_task_options_take_directory_and_read_the_older_record(tmp_path: Path) -> None:
    to = Placement("mirrored", devices=2)
    with _warns("TaskOptions.of", "directory", "out_dir"):
        options = TaskOptions.of(RunOptions(epochs=3), directory=tmp_path, to=to, resume=False)
    assert options == TaskOptions.of(RunOptions(epochs=3), out_dir=tmp_path, to=to, resume=False)
    assert (options.out_dir, options.strategy, options.devices, options.epochs) == (str(tmp_path.resolve()),
                                                                                    "mirrored", 2, 3)
    with _warns("TaskOptions.__init__", "directory", "out_dir"):
        assert TaskOptions(directory=options.out_dir, strategy="mirrored", devices=2, epochs=3) == options
    with pytest.warns(DeprecationWarning, match=f"^TaskOptions.directory is now TaskOptions.out_dir{LATER}$"):
        assert options.directory == str(tmp_path.resolve())

    record = json.loads(options.to_env()[ENV_MIGRATION])
    assert "out_dir" in record and "directory" not in record
    record["directory"] = record.pop("out_dir")  # what the previous release's launcher wrote
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a task reads it without a warning in its output
        read = TaskOptions.from_env({ENV_MIGRATION: json.dumps(record)})
    assert read == options
    names = {f.name for f in fields(TaskOptions)}
    assert "out_dir" in names and "directory" not in names
