"""Ownership of TFF's C++ worker process.

TFF 0.87's default local execution context starts ``tensorflow_federated/data/worker_binary``
as a child process with the parent's stdout and stderr and relies on ``__del__`` to stop it.
At interpreter exit that does not run, so the worker is orphaned and keeps the parent's output
pipes open: ``python sim.py | tail`` and test runners that capture output then hang.

tensorfleet starts the worker itself and gives TFF an execution context that talks to it:

* the worker's output goes to ``/dev/null`` (or a log file), never to the parent's pipes;
* the kernel kills the worker when the thread that started it dies (``PR_SET_PDEATHSIG``), so
  even a ``SIGKILL``-ed parent leaves nothing behind;
* :meth:`LocalWorker.stop` ends it when a simulation ends, and an ``atexit`` hook ends any
  worker still running at interpreter exit;
* the worker is (re)started lazily, on the first computation that needs it.

The :class:`Runtime` is the seam a multi-worker execution (remote C++ workers, mergeable
computations) plugs into: :func:`managed_context` only needs something with ``stub()`` per
worker.

Example:
    >>> import numpy as np
    >>> import tensorflow_federated as tff
    >>> from tensorfleet.federated.backends.tff import managed_context
    >>> @tff.tensorflow.computation(np.int32)
    ... def double(x):
    ...     return x * 2
    >>> with managed_context() as rt:
    ...     result = double(21)   # runs on rt's own worker
    ...     rt.worker.running
    True
    >>> int(result), rt.worker.running
    (42, False)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Iterator

from tensorfleet import validation

__all__ = [
    "GRPC_OPTIONS", "LocalWorker", "Runtime", "close_channel", "default_runtime", "die_with_parent", "install_default",
    "live_workers",
    "managed_context", "stop_all", "worker_binary_path",
]

_LIVE: "weakref.WeakSet[LocalWorker]" = weakref.WeakSet()
_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False
_DEFAULT: "Runtime | None" = None
_PR_SET_PDEATHSIG = 1
# gRPC channel options for talking to a worker: TFF's messages (a model, a round's data) can be large.
GRPC_OPTIONS = [
    ("grpc.max_message_length", 2 * 1000 * 1000 * 1000),
    ("grpc.max_receive_message_length", 2 * 1000 * 1000 * 1000),
    ("grpc.max_send_message_length", 2 * 1000 * 1000 * 1000),
]


def worker_binary_path() -> Path:
    """Path of the C++ worker that the installed tensorflow-federated ships."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow_federated")
    if spec is None or spec.origin is None:
        from tensorfleet.compat.tff import TFF_TRACK_HINT, TffUnavailableError

        raise TffUnavailableError(f"TFF's worker_binary comes with tensorflow-federated, which is not installed. "
                                  f"{TFF_TRACK_HINT}.")
    path = Path(spec.origin).parent / "data" / "worker_binary"
    if not path.is_file():
        raise RuntimeError(f"Expected TFF's worker binary at {path}, but there is no such file.")
    return path


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("localhost", port), timeout=0.2):
            return True
    except OSError:
        return False


def die_with_parent() -> None:
    """Makes the kernel kill this process when its parent thread dies (runs in a child between fork and exec)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # pragma: no cover - non-glibc systems still get the atexit hook
        pass


def _register_atexit() -> None:
    global _ATEXIT_REGISTERED
    with _LOCK:
        if not _ATEXIT_REGISTERED:
            atexit.register(stop_all)
            _ATEXIT_REGISTERED = True


def live_workers() -> list["LocalWorker"]:
    """Workers started by this process that are still running."""
    return [w for w in list(_LIVE) if w.running]


def stop_all() -> None:
    """Stops every worker this process started (registered with ``atexit``)."""
    for worker in list(_LIVE):
        worker.stop()


class LocalWorker:
    """One TFF C++ worker (``worker_binary``) whose life this process owns.

    Args:
        port: TCP port to serve on; picked with portpicker when None.
        max_concurrent_computation_calls: passed to the binary; nonpositive means no limit.
        log_path: file that receives the worker's output; ``/dev/null`` when None.
        startup_timeout: seconds to wait for the worker's gRPC channel to become ready.

    Example:
        >>> worker = LocalWorker()
        >>> worker.start().pid > 0
        True
        >>> worker.stop()
    """

    def __init__(self, *, port: int | None = None, max_concurrent_computation_calls: int = -1,
                 log_path: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0) -> None:
        self._requested_port = None if port is None else validation.port("port", port)
        self.port: int | None = None
        self.max_concurrent_computation_calls = validation.integer("max_concurrent_computation_calls",
                                                                   max_concurrent_computation_calls)
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout = validation.number("startup_timeout", startup_timeout, above=0)
        self._process: subprocess.Popen[bytes] | None = None
        self._stub: Any = None
        self._channel: Any = None
        self._log: IO[bytes] | None = None
        self.generation = 0  # bumped on each start, so executors bound to an old worker are dropped
        self._lock = threading.RLock()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        """The ``subprocess.Popen`` of the worker process (None when it is not started)."""
        return self._process

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> "LocalWorker":
        """Starts the worker (if not running) and waits until it serves; returns self."""
        import grpc
        import portpicker

        from tensorfleet.compat import tff as compat_tff

        with self._lock:
            if self.running and self._stub is not None and self._stub.is_ready:
                return self
            self.stop()
            port = self._requested_port or portpicker.pick_unused_port()
            args = [str(worker_binary_path()), f"--port={port}",
                    f"--max_concurrent_computation_calls={self.max_concurrent_computation_calls}"]
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
                out: Any = self._log
            else:
                out = subprocess.DEVNULL
            self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                             preexec_fn=die_with_parent, close_fds=True)
            _LIVE.add(self)
            _register_atexit()
            self.port = port
            deadline = time.monotonic() + self.startup_timeout
            # Wait for the port before opening the gRPC channel: a channel that first fails to
            # connect backs off exponentially and would only notice the worker many seconds later.
            while not _port_open(port):
                self._check_alive_or_raise(port, deadline)
                time.sleep(0.02)
            self._channel = grpc.insecure_channel(f"localhost:{port}", GRPC_OPTIONS)
            self._stub = compat_tff.executor_stub(self._channel)
            while not self._stub.is_ready:
                self._check_alive_or_raise(port, deadline)
                time.sleep(0.02)
            self.generation += 1
            return self

    def _check_alive_or_raise(self, port: int, deadline: float) -> None:
        assert self._process is not None
        if self._process.poll() is not None:
            code = self._process.returncode
            self.stop()
            raise RuntimeError(f"TFF's worker_binary exited with status {code} while starting on port {port}.")
        if time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"TFF's worker_binary did not become ready on port {port} within "
                               f"{self.startup_timeout:g} s.")

    def stub(self) -> Any:
        """The gRPC stub of a running worker, starting it first when needed."""
        with self._lock:
            if not (self.running and self._stub is not None and self._stub.is_ready):
                self.start()
            return self._stub

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the worker (SIGINT, then SIGKILL after ``timeout``) and reaps it. Idempotent."""
        with self._lock:
            process, self._process = self._process, None
            if self._channel is not None:
                close_channel(self._channel)
            self._channel = None
            self._stub = None
            if process is not None:
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGINT)
                    try:
                        process.wait(timeout)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
            if self._log is not None:
                self._log.close()
                self._log = None
            _LIVE.discard(self)

    def __enter__(self) -> "LocalWorker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # best effort; stop() and atexit are the real guarantees
        with contextlib.suppress(Exception):
            self.stop(timeout=1.0)


class Runtime:
    """A TFF execution context backed by workers this process owns.

    Args:
        worker: the worker to run on; a fresh :class:`LocalWorker` when None.

    ``context`` is a ``tff`` synchronous execution context; install it with
    :meth:`installed` (or use :func:`managed_context`).
    """

    def __init__(self, worker: LocalWorker | None = None) -> None:
        self.worker = worker if worker is not None else LocalWorker()
        self._context: Any = None

    @property
    def context(self) -> Any:
        if self._context is None:
            self._context = _build_context(self.worker)
        return self._context

    @contextlib.contextmanager
    def installed(self) -> Iterator["Runtime"]:
        """Makes this runtime TFF's current context for the ``with`` block."""
        from tensorfleet.compat.tff import import_tff

        tff = import_tff("the tff backend")

        with tff.framework.get_context_stack().install(self.context):
            yield self

    def stop(self) -> None:
        """Stops the worker; the next computation starts it again."""
        self.worker.stop()


def _build_context(worker: LocalWorker) -> Any:
    from tensorfleet.compat import tff as compat_tff

    tff = compat_tff.import_tff("the tff backend")

    class _WorkerExecutorFactory(compat_tff.executor_factory_base()):  # type: ignore[misc]
        """One remote executor per (worker generation, cardinalities)."""

        def __init__(self) -> None:
            self._executors: dict[tuple[Any, ...], Any] = {}

        def create_executor(self, cardinalities: Any) -> Any:
            cardinalities = dict(cardinalities)
            cardinalities.setdefault(tff.CLIENTS, 0)
            if cardinalities[tff.CLIENTS] is None:
                cardinalities[tff.CLIENTS] = 0
            stub = worker.stub()
            key = (worker.generation, tuple(sorted((str(k), v) for k, v in cardinalities.items())))
            executor = self._executors.get(key)
            if executor is None:
                self._executors = {k: v for k, v in self._executors.items() if k[0] == worker.generation}
                executor = compat_tff.remote_executor(stub, cardinalities)
                self._executors[key] = executor
            return executor

        def clean_up_executor(self, cardinalities: Any) -> None:
            for key in [k for k in self._executors if k[0] != worker.generation]:
                self._executors.pop(key).close()

    return compat_tff.sync_execution_context(_WorkerExecutorFactory())


@contextlib.contextmanager
def managed_context(runtime: Runtime | None = None, *, stop: bool = True) -> Iterator[Runtime]:
    """Runs TFF computations in the block on a worker this process owns; stops it after.

    Args:
        runtime: the runtime to install; a new one on a fresh worker when None.
        stop: stop the worker when the block ends (True) or leave it for reuse.

    Example:
        >>> import numpy as np
        >>> import tensorflow_federated as tff
        >>> @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
        ... def total(values):
        ...     return tff.federated_sum(values)
        >>> with managed_context() as rt:
        ...     result = total([1, 2, 3])
        >>> int(result), rt.worker.running
        (6, False)
    """
    rt = runtime if runtime is not None else Runtime()
    try:
        with rt.installed():
            yield rt
    finally:
        if stop:
            rt.stop()


def default_runtime() -> Runtime:
    """The process-wide runtime that :func:`install_default` puts under TFF."""
    global _DEFAULT
    with _LOCK:
        if _DEFAULT is None:
            _DEFAULT = Runtime()
        return _DEFAULT


def install_default() -> Runtime:
    """Makes TFF's default context one whose worker this process owns; returns its runtime.

    Importing ``tensorflow_federated`` installs a context that would start an unowned worker
    on the first computation; tensorfleet replaces it before anything runs, so computations
    run outside a :class:`~tensorfleet.federated.Simulation` are covered too (their worker is
    started lazily and stopped at exit).
    """
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the tff backend")
    rt = default_runtime()
    stack = tff.framework.get_context_stack()
    if stack.current is not rt.context:
        tff.framework.set_default_context(rt.context)
    return rt


def close_channel(channel: Any) -> None:
    """Closes a gRPC channel once its connectivity polling thread has stopped
    (:func:`tensorfleet.compat.tff.close_channel`)."""
    from tensorfleet.compat.tff import close_channel as close

    close(channel)
