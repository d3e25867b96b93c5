"""Collectives over the session's 4 logical CPUs with real tensors: sums, counts, step counts
(the counts against :mod:`tensorfleet.planner.traffic`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensorfleet.planner import collectives as C, traffic as T
from tensorfleet.registry import UnknownNameError

ALGORITHMS = ["ps", "naive", "ring", "tree", "butterfly", "halving_doubling"]
M = 24  # divisible by 2, 4 and 8


def _values(n: int, m: int = M) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.normal(size=m).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_reduce_equals_plain_sum_and_counts_exactly(logical_cpus, algorithm, n):
    values = _values(n)
    result = C.all_reduce(values, algorithm=algorithm, devices=logical_cpus)
    expected = np.sum(values, axis=0)
    assert len(result.outputs) == n
    for i, out in enumerate(result.outputs):
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
        assert out.device.endswith(logical_cpus[i % 4].split("device:")[-1])
    trace = result.trace
    assert trace.total_sent == T.exact_traffic(algorithm, n, M)
    assert trace.step_values == T.exact_step_values(algorithm, n, M)
    assert sum(trace.received.values()) == trace.total_sent


@pytest.mark.parametrize("n,steps", [(2, 2), (4, 6), (8, 14)])
def test_ring_step_count_and_per_node_traffic(logical_cpus, n, steps):
    trace = C.all_reduce(_values(n), algorithm="ring", devices=logical_cpus).trace
    assert trace.num_steps == steps == 2 * (n - 1)
    assert set(trace.sent.values()) == {2 * (n - 1) * M // n}


def test_ps_traffic_is_concentrated_on_the_server(logical_cpus):
    trace = C.all_reduce(_values(4), algorithm="ps", devices=logical_cpus).trace
    assert trace.sent[C.PS_NODE] == 4 * M and trace.received[C.PS_NODE] == 4 * M
    assert [trace.sent[i] for i in range(4)] == [M] * 4


def test_broadcast_gather_and_all_gather(logical_cpus):
    x = np.arange(6, dtype=np.float32)
    out = C.broadcast(x, 5, root=2, devices=logical_cpus)
    for o in out.outputs:
        np.testing.assert_array_equal(o.numpy(), x)
    assert out.trace.total_sent == 4 * 6 and out.trace.num_steps == 3 and out.trace.sent[2] == 18

    values = _values(4)
    g = C.gather(values, root=1, devices=logical_cpus)
    np.testing.assert_array_equal(g.outputs[1].numpy(), np.concatenate(values))
    assert g.outputs[0] is None and g.trace.total_sent == 3 * M and g.trace.num_steps == 1

    ag = C.all_gather(values, devices=logical_cpus)
    for o in ag.outputs:
        np.testing.assert_array_equal(o.numpy(), np.concatenate(values))
    assert ag.trace.total_sent == 4 * 3 * M and ag.trace.num_steps == 3


def test_bad_inputs_raise_clear_errors(logical_cpus):
    with pytest.raises(UnknownNameError, match="Did you mean 'ring'"):
        C.all_reduce(_values(2), algorithm="rnig")
    with pytest.raises(ValueError, match="power-of-two number of nodes. Received: N=3"):
        C.all_reduce(_values(3), algorithm="butterfly", devices=logical_cpus)
    with pytest.raises(ValueError, match="at least 2 per-node tensors"):
        C.all_reduce(_values(1), algorithm="ring")
    with pytest.raises(ValueError, match=r"same size. Received sizes: \[3, 4\]"):
        C.all_reduce([np.zeros(3), np.zeros(4)], algorithm="ring")
    with pytest.raises(ValueError, match="root must be an integer from 0 to 3. Received: root=4"):
        C.broadcast(np.zeros(2), 4, root=4)
    with pytest.raises(ValueError, match="num_nodes must be an integer >= 2. Received: num_nodes=1"):
        C.broadcast(np.zeros(2), 1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_eight_real_logical_devices_in_a_subprocess():
    code = textwrap.dedent(
        """
        from tensorfleet.strategies.devices import simulate_devices
        devices = simulate_devices(8)
        import numpy as np
        from tensorfleet.planner import collectives as C, traffic as T
        values = [np.full(16, i, np.float32) for i in range(8)]
        for name in C.COLLECTIVES.names():
            r = C.all_reduce(values, algorithm=name, devices=devices)
            assert all(np.array_equal(o.numpy(), np.full(16, 28.0)) for o in r.outputs), name
            assert len({o.device for o in r.outputs}) == 8, name
            assert r.trace.total_sent == T.exact_traffic(name, 8, 16), name
            print(name, r.trace.total_sent, r.trace.num_steps)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines == {"ps": "256 2", "naive": "896 1", "ring": "224 14", "tree": "224 6",
                     "butterfly": "384 3", "halving_doubling": "224 6"}
