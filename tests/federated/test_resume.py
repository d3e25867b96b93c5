"""A simulation killed mid-run resumes from its checkpoint and ends with the uninterrupted model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import reap

# On TFF's runtime, whose rounds are slow enough to kill one mid-run; the compiled backend's resume is
# tested in tests/federated/backends/test_compiled.py.
pytestmark = pytest.mark.tff

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 12

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorfleet as tfl
    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=20, scheme="dirichlet:0.5", seed=3)
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp", hidden=8), clients, "fedadam",
                                   rounds=%d, clients_per_round=5, seed=11, dropout=0.2,
                                   out_dir=sys.argv[1], checkpoint_every=1, progress=False, tensorboard=False,
                                   backend="tff")
    sim.run()
    np.savez(sys.argv[1] + "/final.npz", *sim.final_weights())
""" % ROUNDS)


def _run(out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, cwd=ROOT)


def _checkpoint_round(out: Path) -> int:
    try:
        return max(r["round"] for r in json.loads((out / "metrics.json").read_text())["rounds"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def _finish(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        reap(proc)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_killed_run_resumes_and_ends_with_the_uninterrupted_model(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    reference = _run(straight)
    victim = _run(killed)
    try:
        deadline = time.monotonic() + 240
        while _checkpoint_round(killed) < 3:
            assert victim.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint after 240 s"
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        reap(victim)
    stopped_at = _checkpoint_round(killed)
    assert 3 <= stopped_at < ROUNDS and not (killed / "final.npz").exists()
    assert _finish(reference, 300) == 0
    assert _finish(_run(killed), 300) == 0  # same arguments, same out_dir: resumes

    history = json.loads((killed / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in history] == list(range(1, ROUNDS + 1))
    with np.load(straight / "final.npz") as a, np.load(killed / "final.npz") as b:
        assert len(a.files) == len(b.files) == 4
        for key in a.files:
            np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-6)
    straight_history = json.loads((straight / "metrics.json").read_text())["rounds"]
    assert [r["participants"] for r in history] == [r["participants"] for r in straight_history]
