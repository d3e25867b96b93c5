"""Parameter-server fits that each lose a worker mid-training, run as a child process by
test_parameter_server_failure.py.

The ps and the workers are separate processes (``python -m tensorfleet.cluster.launcher
--serve``, as the launcher starts them), so worker 1 can really be killed; this process is the
coordinator. For each staleness setting in turn, one Keras fit runs under it; worker 1 is
SIGKILLed once the parameter server has counted ``--kill-at`` updates of that fit and started
again on the same port after ``--down`` seconds. Every step sleeps ``--pause`` seconds after
its update reached the parameter server, so the kill most likely lands between a step's update
and its reply: the case in which TensorFlow's coordinator runs an applied step again. Prints one
JSON line of results per setting; every child is killed and reaped on the way out.

    python -m tests.strategies.ps_failure_job --staleness 0,2,none --steps 24 --kill-at 8
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SERVE = [sys.executable, "-m", "tensorfleet.cluster.launcher", "--serve"]


def start_task(spec, role: str, index: int, env: dict[str, str]) -> subprocess.Popen:
    """Starts one task's server process; :func:`wait_serving` waits for it."""
    return subprocess.Popen(SERVE, env={**env, "TF_CONFIG": spec.tf_config_json(role, index)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_serving(proc: subprocess.Popen, timeout: float = 90) -> None:
    """Waits until the server says it serves, then drains its output in the background."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:  # type: ignore[union-attr]
        if "serving at" in line or time.monotonic() > deadline:
            break
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--staleness", default="none", help="comma-separated: k >= 0 or none, one fit each")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kill-at", type=int, default=8)
    parser.add_argument("--down", type=float, default=1.0)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from tensorfleet.netbind import loopback_env
    from tensorfleet.strategies.tf_config import ClusterSpec

    spec = ClusterSpec.local(workers=args.workers, ps=1)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(loopback_env("127.0.0.1", environ=env))
    children: dict[str, subprocess.Popen] = {}
    try:
        for task in spec.tasks():
            children[str(task)] = start_task(spec, task.role, task.index, env)
        for proc in list(children.values()):
            wait_serving(proc)
        run(args, spec, env, children)
    finally:
        for proc in children.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    os._exit(0)  # the coordinator's threads would keep the interpreter alive


def run(args: argparse.Namespace, spec, env: dict[str, str], children: dict[str, subprocess.Popen]) -> None:
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.compat import distribute as tf_internals
    from tensorfleet.strategies import staleness as consistency

    strategy = tfl.strategies.build("parameter_server", cluster=spec)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    pause_us = int(args.pause * 1e6)
    n = args.steps * 4

    class Counting(tf_keras.Model):
        """One weight; every step adds 1 to it and counts its examples, then pauses."""

        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(0.0)
            self.seen = tf.Variable(tf.zeros([n], tf.int32), trainable=False)

        def call(self, x):
            return x * self.w

        def train_step(self, data):
            x, _ = data
            ids = tf.cast(tf.reshape(x, [-1]), tf.int32)
            self.optimizer.apply_gradients([(tf.constant(-1.0), self.w)])  # SGD(1.0): w += 1
            counted = self.seen.scatter_nd_add(ids[:, None], tf.ones_like(ids))
            with tf.control_dependencies([self.w.read_value(), counted.read_value()]):
                slept = tf.data.Dataset.range(1).apply(tf_internals.sleep_transformation(pause_us)).reduce(
                    tf.constant(0, tf.int64), lambda total, value: total + value)
            with tf.control_dependencies([slept]):
                return {"w": tf.identity(self.w)}

    ids = np.arange(n, dtype=np.float32)[:, None]
    for setting in args.staleness.split(","):
        gate = consistency.install(coordinator, None if setting == "none" else int(setting))
        with strategy.scope():
            model = Counting()
            model.compile(optimizer=tf_keras.optimizers.SGD(1.0))
        inputs = tfl.strategies.fit_inputs(ids, np.zeros(n, np.float32), batch_size=4, strategy=model,
                                           steps_per_epoch=args.steps)
        events: list[str] = []

        def fault() -> None:
            while int(model.optimizer.iterations.numpy()) < args.kill_at:
                time.sleep(0.02)
            children["worker:1"].send_signal(signal.SIGKILL)
            children["worker:1"].wait()
            events.append(f"killed worker:1 at {int(model.optimizer.iterations.numpy())} updates")
            time.sleep(args.down)
            children["worker:1"] = start_task(spec, "worker", 1, env)
            wait_serving(children["worker:1"])
            events.append("restarted worker:1")

        killer = threading.Thread(target=fault, daemon=True)
        killer.start()
        start = time.monotonic()
        error = ""
        try:
            model.fit(**inputs, epochs=1, verbose=0)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            error = f"{type(exc).__name__}: {exc}"[:500]
        seconds = time.monotonic() - start
        killer.join(timeout=120)
        print(json.dumps({
            "staleness": setting,
            "error": error,
            "events": events,
            "planned": args.steps,
            "iterations": int(model.optimizer.iterations.numpy()),
            "w": float(model.w.numpy()),
            "batches_counted": int(model.seen.numpy().sum()) // 4,
            "clocks": gate.clocks if gate else None,
            "finished": getattr(gate, "finished", None),
            "gaps": [g for _, g in gate.gaps] if gate else None,
            "retried": getattr(gate, "retried", None),
            "seconds": round(seconds, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
