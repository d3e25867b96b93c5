"""Step ranges, task directories and the environment switch, without running the profiler."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorfleet.profiling.recorder import StepRange, callbacks, task_directory


def test_step_ranges_parse_from_text_numbers_and_ranges():
    assert StepRange.parse("20-30") == StepRange(20, 30)
    assert StepRange.parse(" 7 ") == StepRange(7, 7)
    assert StepRange.parse(5) == StepRange(5, 5)
    assert StepRange.parse(range(3, 6)) == StepRange(3, 5)
    assert 30 in StepRange(20, 30) and 31 not in StepRange(20, 30)


@pytest.mark.parametrize("bad", ["30-20", "a-b", "-3", "", True, -1, range(0), range(0, 10, 2), 2.5])
def test_a_bad_step_range_is_refused_with_the_value(bad):
    with pytest.raises(ValueError) as error:
        StepRange.parse(bad)
    assert str(error.value) == ("steps must be a step range FIRST-LAST with FIRST <= LAST, such as '20-30'. "
                                f"Received: steps={bad!r}")


def test_each_task_gets_its_own_directory_from_tf_config(tmp_path):
    config = ('{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, '
              '"task": {"type": "ps", "index": 0}}')
    assert task_directory(tmp_path, environ={"TF_CONFIG": config}) == tmp_path / "ps-0"
    assert task_directory(tmp_path, environ={}) == tmp_path / "local"
    assert task_directory(tmp_path, "worker-1", environ={"TF_CONFIG": config}) == tmp_path / "worker-1"
    with pytest.raises(ValueError, match=r"task must be a folder name such as 'worker-1'. Received: task='a/b'"):
        task_directory(tmp_path, "a/b")


def test_the_environment_turns_recording_on(tmp_path):
    assert callbacks({}) == [] and callbacks({"TENSORFLEET_PROFILE_STEPS": " "}) == []
    (callback,) = callbacks({"TENSORFLEET_PROFILE_STEPS": "20-30", "TENSORFLEET_PROFILE_DIR": str(tmp_path)})
    assert callback.capture.steps == StepRange(20, 30) and callback.directory == tmp_path / "local"
    with pytest.raises(ValueError, match=r"^TENSORFLEET_PROFILE_STEPS must be a step range .* "
                                         r"Received: TENSORFLEET_PROFILE_STEPS='20:30'$"):
        callbacks({"TENSORFLEET_PROFILE_STEPS": "20:30"})


def test_the_older_logdir_keyword_works_for_a_release_with_a_warning():
    with pytest.warns(DeprecationWarning, match=r"task_directory: 'logdir' is now 'out_dir'"):
        assert task_directory(logdir="profile", task="worker-1") == Path("profile") / "worker-1"
