"""The compiled backend across processes: its lanes on TensorFlow servers (the current track's workers).

``Simulation(..., backend="compiled", workers=["127.0.0.1:8471", ...])`` runs each round's clients on
worker processes of TensorFlow's own distributed runtime: every worker is a ``tf.distribute.Server``
(``tensorfleet federated worker --port P``, or :class:`TfWorker` from Python), this process joins them
as the client of a remote-eager cluster (``tf.config.experimental_connect_to_cluster``; its own
devices keep their names, so what it made before stays usable), and each lane of
:class:`~tensorfleet.federated.backends.compiled.engine.CompiledFedAvg` keeps its copy of the model on
one worker and trains its share of the round's clients there, inside the one traced round. The
server's weights, the optimizer's and aggregator's state and the sums stay in this process: a worker
receives the round's weights and its clients' examples, and sends back its updates' sum (or rows).

A worker that stops answering (its process gone) fails the round's call with TensorFlow's
``UnavailableError``; the round is then run again on the workers left (the server's state changes only
after every lane has finished, so a failed call changed nothing), and when none is left one
:class:`~tensorfleet.federated.backends.addresses.AllWorkersLostError` says so. TensorFlow cannot take
a task out of a cluster it joined (a smaller cluster definition crashes the process), so a lost
worker's lane is simply left out, and one process joins one set of workers.

A FROZEN worker (stopped, hung: its port still accepts connections, it never answers) would hold the
round's call forever, so with ``round_timeout`` the call runs in a thread of its own: when it has not
ended after ``round_timeout`` seconds, every worker is asked for its status over TensorFlow's own gRPC
service (:func:`~tensorfleet.compat.distribute.worker_answers`, ``lost_timeout`` seconds' deadline), the
silent ones are marked lost and the call is abandoned (:class:`RoundAbandoned`). An abandoned call may
still end if the worker thaws; it then writes only variables nothing reads any more (the engine's
``rebind`` gives the server's state fresh variables holding the state before the round, and the lanes
left fresh models), so the round run again on the workers left is the only one that counts.

Example:
    >>> import portpicker
    >>> with TfWorker(portpicker.pick_unused_port()) as worker:  # doctest: +SKIP
    ...     worker.running
    True
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from typing import Any, Callable, Sequence

from tensorfleet.federated.backends.addresses import (
    AllWorkersLostError,
    WorkerAddress,
    WorkerUnreachableError,
    parse_addresses,
)

__all__ = ["DEFAULT_ROUND_TIMEOUT", "LOST_TIMEOUT", "RoundAbandoned", "TfWorker", "WorkerSet", "connect",
           "reachable", "serve", "worker_device"]

READY = "tensorfleet: TensorFlow worker ready on"
DEFAULT_ROUND_TIMEOUT = 120.0  # seconds a round's call runs before the workers are asked whether they answer
LOST_TIMEOUT = 5.0  # seconds a worker has to answer that question


class RoundAbandoned(RuntimeError):
    """A round's call was abandoned: the workers it names did not answer (frozen) and are marked lost."""


def worker_device(task: int) -> str:
    """The device of worker ``task`` (the order of ``workers=``) as this process names it."""
    return f"/job:worker/replica:0/task:{task}/device:CPU:0"


def reachable(address: WorkerAddress | str, timeout: float = 2.0) -> bool:
    """Whether a process accepts connections on ``address`` (a killed worker's port refuses them)."""
    target = parse_addresses([str(address)])[0]
    try:
        with socket.create_connection((target.host, target.port), timeout=timeout):
            return True
    except OSError:
        return False


class WorkerSet:
    """The workers this process joined, in ``workers=`` order, and which of them are still there."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = tuple(addresses)
        self.lost: list[str] = []
        self.round_timeout: float | None = DEFAULT_ROUND_TIMEOUT
        self.lost_timeout = LOST_TIMEOUT
        self.abandoned: list[threading.Thread] = []  # the calls abandoned (they may end if a worker thaws)

    @property
    def devices(self) -> list[str]:
        """The devices of the workers not lost."""
        return [worker_device(i) for i, a in enumerate(self.addresses) if a not in self.lost]

    def drop_unreachable(self) -> list[str]:
        """Marks the workers that no longer accept connections as lost; returns those found now.

        Raises:
            AllWorkersLostError: no worker is left.
        """
        found = [a for a in self.addresses if a not in self.lost and not reachable(a)]
        self.lost.extend(found)
        self.check_left()
        return found

    def check_left(self) -> None:
        """Raises AllWorkersLostError when every worker is lost."""
        if len(self.lost) == len(self.addresses):
            raise AllWorkersLostError(f"Every worker of the compiled backend is lost ({', '.join(self.lost)}); "
                                      "the rounds done so far are kept (checkpoint them with out_dir and "
                                      "checkpoint_every). Start workers again and resume the run.")

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a round's traced call), its tensors read as numpy arrays; with ``round_timeout``,
        in a thread of its own, abandoned when a worker stops answering.

        Raises:
            RoundAbandoned: after ``round_timeout`` seconds some workers did not answer within
                ``lost_timeout``; they are marked lost (perhaps all of them: :meth:`check_left`).
        """
        import tensorflow as tf

        def run() -> Any:
            return tf.nest.map_structure(lambda t: t.numpy(), fn(*args))

        if self.round_timeout is None:
            return run()
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["out"] = run()
            except BaseException as err:  # noqa: BLE001  (re-raised in the caller's thread)
                box["err"] = err
            finally:
                done.set()

        thread = threading.Thread(target=target, name="tensorfleet-round", daemon=True)
        thread.start()
        while not done.wait(self.round_timeout):
            silent = [a for a in self.addresses if a not in self.lost and not self.answers(a)]
            if silent:
                self.abandoned.append(thread)
                self.lost.extend(silent)
                raise RoundAbandoned(f"No answer within {self.lost_timeout:g} s from worker(s) {', '.join(silent)} "
                                     f"after {self.round_timeout:g} s of a round (stopped or hung).")
        if "err" in box:
            raise box["err"]
        return box["out"]

    def answers(self, address: str) -> bool:
        """Whether the worker at ``address`` answers a status call within ``lost_timeout`` seconds."""
        from tensorfleet.compat.distribute import worker_answers

        return worker_answers(parse_addresses([address])[0].target, self.lost_timeout)


_JOINED: list[WorkerSet] = []  # the one set of workers this process joined
_LIVE: "weakref.WeakSet[TfWorker]" = weakref.WeakSet()  # the workers this process started, stopped at exit


@atexit.register
def _stop_live() -> None:
    for worker in list(_LIVE):
        worker.stop()


def connect(workers: Sequence[str] | str) -> WorkerSet:
    """Joins this process to the TensorFlow workers at ``workers`` (once per process; again with the same
    addresses, the same :class:`WorkerSet`).

    Raises:
        WorkerUnreachableError: a worker does not accept connections (the message says how to start one).
        ValueError: this process already joined another set of workers.
    """
    import tensorflow as tf

    addresses = tuple(str(a) for a in parse_addresses(workers))
    if _JOINED:
        if _JOINED[0].addresses != addresses:
            raise ValueError(f"This process already joined the workers {list(_JOINED[0].addresses)}; TensorFlow "
                             f"joins one cluster per process. Received: workers={list(addresses)}; run it in a "
                             "new process.")
        return _JOINED[0]
    for address in addresses:
        if not reachable(address, timeout=5.0):
            port = address.rsplit(":", 1)[1]
            raise WorkerUnreachableError(f"No TensorFlow worker answers at {address}. Start one with "
                                         f"`tensorfleet federated worker --port {port}` (current track).")
    spec = tf.train.ClusterSpec({"worker": [parse_addresses([a])[0].target for a in addresses]})
    # job_name "localhost": this process's devices keep their names, so variables made before stay usable.
    tf.config.experimental_connect_to_cluster(spec, job_name="localhost")
    _JOINED.append(WorkerSet(addresses))
    return _JOINED[0]


def serve(port: int, *, host: str = "127.0.0.1", on_ready: Callable[[str], None] | None = None) -> int:
    """Serves one TensorFlow worker on ``host:port`` in this process until SIGTERM or SIGINT; returns 0.

    The server binds ``host`` only where the process was started with tensorfleet's bind shim
    (:class:`TfWorker` and ``tensorfleet federated worker`` start it so); TensorFlow itself binds every
    interface.
    """
    import tensorflow as tf

    from tensorfleet import validation

    validation.port("port", port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = tf.distribute.Server(tf.train.ClusterSpec({"worker": [f"{host}:{port}"]}), job_name="worker",
                                  task_index=0, protocol="grpc", start=True)
    if on_ready is not None:
        on_ready(f"{host}:{port}")
    stop.wait()
    del server
    return 0


class TfWorker:
    """One TensorFlow worker process on ``host:port`` (``tensorfleet federated worker``), stopped on exit.

    Args:
        port: the port to serve on.
        host: the address it serves on (127.0.0.1 by default: it runs any graph a client sends).
        start_timeout: seconds to wait for the worker to be ready.
    """

    def __init__(self, port: int, *, host: str = "127.0.0.1", start_timeout: float = 120.0) -> None:
        self.port, self.host, self.start_timeout = int(port), host, float(start_timeout)
        self.process: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> "TfWorker":
        """Starts the worker and waits until it serves."""
        from tensorfleet.netbind import loopback_env

        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        if self.host not in ("0.0.0.0", "::"):  # a worker runs any graph a client sends: keep it on its host
            env.update(loopback_env(self.host))
        from tensorfleet.federated.backends.tff import die_with_parent

        self.process = subprocess.Popen(
            [sys.executable, "-m", "tensorfleet", "federated", "worker", "--runtime", "tensorflow",
             "--port", str(self.port), "--host", self.host], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env, preexec_fn=die_with_parent, close_fds=True)  # dies with this process too
        _LIVE.add(self)
        ready = threading.Event()
        lines: list[str] = []

        def watch() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                lines.append(line)
                if line.startswith(READY):
                    ready.set()
            ready.set()  # the process ended

        threading.Thread(target=watch, daemon=True).start()
        if not ready.wait(self.start_timeout) or not self.running:
            self.stop()
            raise RuntimeError(f"The TensorFlow worker on {self.address} did not start: {''.join(lines)[-500:]}")
        return self

    def stop(self) -> None:
        """Stops the worker (SIGTERM, then SIGKILL) and waits for it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "TfWorker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
