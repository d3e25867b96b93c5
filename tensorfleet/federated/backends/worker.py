"""One TFF C++ worker on ``host:port``, as an API and as ``tensorfleet federated worker``.

A worker is the ``worker_binary`` that tensorflow-federated ships (its C++ executor service).
:class:`Worker` starts one on a given port for a multi-worker simulation
(:mod:`tensorfleet.federated.backends.remote`), on this machine or in a container, and stops it
cleanly. The process itself is :class:`tensorfleet.federated.backends.tff.LocalWorker`, so it has the
same guarantees: output away from the parent's pipes, killed by the kernel when its parent
dies, stopped at interpreter exit.

The port is checked before the binary starts: the worker's gRPC server sets ``SO_REUSEPORT``,
so a second worker on a busy port would silently share it with the first.

TFF 0.87's ``worker_binary`` has no flag for the address it listens on: it binds every
interface (``[::]:PORT``), and a worker runs any TensorFlow graph a client sends it. So a worker
on a specific ``host`` (``127.0.0.1`` by default) is started with a tiny ``LD_PRELOAD`` library
that turns the binary's wildcard ``bind`` into a bind to ``host`` (compiled once with the system C
compiler into ``~/.cache/tensorfleet``); ``host="0.0.0.0"`` (as in Kubernetes pods) keeps every
interface. Without a C compiler the worker listens on every interface and a warning says so.

Example:
    >>> import portpicker
    >>> from tensorfleet.federated.backends.worker import Worker
    >>> port = portpicker.pick_unused_port()
    >>> with Worker(port=port) as worker:
    ...     worker.address == f"127.0.0.1:{port}", worker.running
    (True, True)
    >>> worker.running
    False
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import warnings
from types import FrameType
from typing import Any, Callable

from tensorfleet import validation
from tensorfleet.federated.backends.tff import LocalWorker
from tensorfleet.netbind import bind_shim_path, loopback_env

__all__ = ["Worker", "WorkerPortInUseError", "bind_shim_path", "check_port_free", "serve", "start_worker"]


_WILDCARD_HOSTS = ("0.0.0.0", "::")
# The worker is checked on "localhost", which resolves to 127.0.0.1 here; other addresses would not answer.
_HOSTS = ("127.0.0.1", "localhost", *_WILDCARD_HOSTS)
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _bound_to(host: str) -> Any:
    """The environment a worker bound to ``host`` starts with.

    LocalWorker's child inherits this process's environment, so it is set around the start
    (under a lock, and put back after); a child another thread starts meanwhile would also get
    it, which only narrows that child's wildcard binds to ``host``.
    """
    if host in _WILDCARD_HOSTS:
        yield
        return
    shim = bind_shim_path()
    if shim is None:
        warnings.warn(f"No C compiler to build the bind library: TFF's worker listens on every interface, not only "
                      f"{host}. Install a C compiler (cc) or block the port with a firewall.", RuntimeWarning,
                      stacklevel=3)
        yield
        return
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "TENSORFLEET_BIND_HOST")}
        os.environ.update(loopback_env("127.0.0.1" if host == "localhost" else host, shim=shim))
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class WorkerPortInUseError(OSError):
    """The port a worker was asked to serve on is taken by another process."""


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raises :class:`WorkerPortInUseError` when ``port`` is taken on any interface.

    Bound without ``SO_REUSEPORT``, so a port held by another TFF worker (whose gRPC server
    sets it) counts as taken. ``host`` only names the worker in the message.
    """
    validation.port("port", port)
    for family, address in ((socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
        except OSError:
            raise WorkerPortInUseError(
                f"Port {port} is in use on {host}: TFF's worker cannot serve there. Pick another port "
                f"(or port=None for a free one), or stop the process that holds it.") from None
        finally:
            sock.close()
        return


class Worker:
    """One TFF C++ worker process serving on ``host:port``.

    Args:
        port: TCP port to serve on; a free one (portpicker) when None.
        host: the address the worker is reached at; ``127.0.0.1`` by default.
        max_concurrent: the binary's ``--max_concurrent_computation_calls`` (nonpositive: no limit).
        log_path: file that receives the worker's output (``/dev/null`` when None).
        startup_timeout: seconds to wait until the worker serves.

    Example:
        >>> worker = Worker().start()   # on a free port
        >>> worker.address, worker.running
        ('127.0.0.1:...', True)
        >>> worker.stop()
        >>> worker.running
        False
    """

    def __init__(self, port: int | None = None, *, host: str = "127.0.0.1", max_concurrent: int = -1,
                 log_path: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0) -> None:
        if port is not None:
            validation.port("port", port)
        if host not in _HOSTS:
            raise ValueError(f"host must be 127.0.0.1 (or localhost) or every interface (0.0.0.0, ::): TFF's worker "
                             f"binds one of those. Received: host={host!r}")
        self.host = host
        self._requested_port = port
        self._worker = LocalWorker(port=port, max_concurrent_computation_calls=validation.integer(
            "max_concurrent", max_concurrent), log_path=log_path, startup_timeout=startup_timeout)

    @property
    def port(self) -> int | None:
        """The port served on (None before the first start when none was asked for)."""
        return self._worker.port if self._worker.port is not None else self._requested_port

    @property
    def address(self) -> str:
        """``host:port``, the form :class:`~tensorfleet.federated.Simulation` takes in ``workers``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._worker.pid

    @property
    def running(self) -> bool:
        return self._worker.running

    @property
    def process(self) -> LocalWorker:
        """The underlying :class:`~tensorfleet.federated.backends.tff.LocalWorker`."""
        return self._worker

    def start(self) -> "Worker":
        """Starts the worker and waits until it serves; returns self.

        Raises:
            WorkerPortInUseError: the port is taken.
            RuntimeError: the binary exited or did not serve within ``startup_timeout``.
        """
        if self.running:
            return self
        if self._requested_port is not None:
            check_port_free(self._requested_port, self.host)
        try:
            with _bound_to(self.host):
                self._worker.start()
        except RuntimeError as err:
            raise RuntimeError(f"TFF worker on {self.host}:{self._worker.port}: {err}") from None
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the worker (SIGINT, SIGKILL after ``timeout``) and reaps it. Idempotent."""
        self._worker.stop(timeout)

    def kill(self) -> None:
        """Kills the worker at once (SIGKILL), as a crash would, and reaps it."""
        pid = self.pid
        if pid is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.stop(timeout=5.0)

    def wait(self, timeout: float | None = None) -> int | None:
        """Waits until the worker process exits; its exit status, or None on timeout."""
        process = self._worker.popen
        if process is None:
            return None
        try:
            return process.wait(timeout)
        except Exception:  # subprocess.TimeoutExpired
            return None

    def __enter__(self) -> "Worker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"Worker({self.address}, {state})"


def start_worker(port: int | None = None, *, host: str = "127.0.0.1", max_concurrent: int = -1,
                 log_path: str | os.PathLike[str] | None = None) -> Worker:
    """Starts one TFF worker and returns it (stop it with ``.stop()``).

    A simulation runs on started workers through their addresses:
    ``Simulation(..., workers=[a.address, b.address])``.

    Example (a sum over four clients split across two workers, both stopped after):
        >>> import numpy as np
        >>> import tensorflow_federated as tff
        >>> from tensorfleet.federated.backends.remote import installed
        >>> @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
        ... def total(values):
        ...     return tff.federated_sum(values)
        >>> with start_worker() as a, start_worker() as b:
        ...     with installed([a.address, b.address]):
        ...         result = total([1, 2, 3, 4])
        >>> int(result), a.running or b.running
        (10, False)
    """
    return Worker(port, host=host, max_concurrent=max_concurrent, log_path=log_path).start()


def serve(port: int, *, host: str = "127.0.0.1", max_concurrent: int = -1,
          log_path: str | os.PathLike[str] | None = None,
          on_ready: Callable[[Worker], None] | None = None) -> int:
    """Runs one worker in the foreground until SIGTERM or SIGINT, then stops it; returns 0.

    Returns the worker's exit status instead when it ends by itself.

    Example (blocks until the process gets SIGTERM or SIGINT, so it is not run here):
        >>> serve(8471)  # doctest: +SKIP
    """
    worker = Worker(port, host=host, max_concurrent=max_concurrent, log_path=log_path)
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        worker.start()
        if on_ready is not None:
            on_ready(worker)
        while not stop.is_set():
            status = worker.wait(timeout=0.2)
            if status is not None:
                return status
        return 0
    finally:
        worker.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
