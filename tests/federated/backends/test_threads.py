"""TensorFlow's thread pools for the compiled backend's lanes: set before the runtime starts, refused after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorfleet.cli.main import main
from tensorfleet.federated.backends.compiled import default_lanes
from tensorfleet.federated.backends.threads import configure_threads, thread_pools

ROOT = Path(__file__).resolve().parents[3]


def _python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})


@pytest.mark.slow
def test_a_new_process_gets_one_intra_op_thread_and_a_thread_per_lane_plus_one() -> None:
    result = _python("""
        import json
        import tensorflow as tf
        import tensorfleet as tfl
        first = tfl.federated.configure_threads(clients_per_round=10)
        again = tfl.federated.configure_threads(clients_per_round=10)  # the same pools: nothing to change
        tf.constant(1.0) + 1.0  # the runtime starts with them
        pools = [tf.config.threading.get_intra_op_parallelism_threads(),
                 tf.config.threading.get_inter_op_parallelism_threads()]
        try:
            tfl.federated.configure_threads(lanes=7)
            late = "no error"
        except RuntimeError as exc:
            late = str(exc)
        print(json.dumps([first, again, pools, late, tfl.federated.configure_threads(lanes=7, strict=False)]))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    first, again, pools, late, lenient = json.loads(result.stdout.splitlines()[-1])
    lanes = default_lanes(10)
    assert first == again == pools == [1, lanes + 1]
    assert late.startswith(f"TensorFlow's thread pools are fixed once its runtime starts, and it has started "
                           f"(intra-op, inter-op = (1, {lanes + 1}); 0 is TensorFlow's default). Call "
                           "configure_threads() before anything builds a model or runs an op, or set "
                           "TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=8 in the environment.")
    assert lenient is None


@pytest.mark.slow
def test_the_environment_s_pools_count_as_configured() -> None:
    result = _python("""
        import json
        from tensorfleet.federated.backends.threads import configure_threads, thread_pools
        print(json.dumps([thread_pools(), configure_threads(lanes=2)]))
    """, env={"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [[1, 3], [1, 3]]


@pytest.mark.parametrize("kwargs,message", [
    ({"clients_per_round": 0}, "clients_per_round must be a positive integer. Received: clients_per_round=0"),
    ({"lanes": True}, "lanes must be a positive integer. Received: lanes=True"),
    ({"lanes": 0}, "lanes must be a positive integer. Received: lanes=0"),
])
def test_bad_arguments_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        configure_threads(**kwargs)


@pytest.mark.slow
def test_the_cli_sets_the_pools_in_a_new_process_and_records_them(tmp_path: Path) -> None:
    runs = {}
    for flag in ([], ["--tf-threads", "tensorflow"]):
        out = tmp_path / (flag[-1] if flag else "default")
        result = subprocess.run(
            [sys.executable, "-m", "tensorfleet.cli.main", "federated", "run", "--clients", "20", "--rounds", "2",
             "--clients-per-round", "4", "--no-progress", "--out", str(out), *flag],
            capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert result.returncode == 0, result.stderr[-2000:]
        runs[out.name] = json.loads((out / "metrics.json").read_text())["config"]
    assert runs["default"]["tf_threads"] == {"intra_op": 1, "inter_op": default_lanes(4) + 1}
    assert runs["default"]["backend"] == "compiled"
    assert runs["tensorflow"]["tf_threads"] == {"intra_op": 0, "inter_op": 0}


def test_asking_the_cli_for_lane_pools_after_tensorflow_started_is_a_clean_error(capsys) -> None:
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # this process's runtime has started
    if thread_pools()[0] == 1:
        pytest.skip("this process already runs with one intra-op thread")
    assert main(["federated", "run", "--rounds", "1", "--tf-threads", "lanes", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for --tf-threads: TensorFlow's thread pools are fixed once its runtime starts" in err
    assert "Traceback" not in err
