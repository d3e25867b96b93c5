"""One TFF C++ worker on ``host:port``, as an API and as ``tensorfleet federated worker``.

A worker is the ``worker_binary`` that tensorflow-federated ships (its C++ executor service).
:class:`Worker` starts one on a given port for a multi-worker simulation
(:mod:`tensorfleet.federated.distributed`), on this machine or in a container, and stops it
cleanly. The process itself is :class:`tensorfleet.federated.runtime.LocalWorker`, so it has the
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
    >>> from tensorfleet.federated.workers import Worker
    >>> with Worker(port=8471) as worker:
    ...     worker.address
    '127.0.0.1:8471'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from tensorfleet.federated.runtime import LocalWorker

__all__ = ["PortInUseError", "Worker", "bind_shim_path", "check_port_free", "serve", "start_worker"]


_WILDCARD_HOSTS = ("0.0.0.0", "::")
# The worker is checked on "localhost", which resolves to 127.0.0.1 here; other addresses would not answer.
_HOSTS = ("127.0.0.1", "localhost", *_WILDCARD_HOSTS)
_ENV_LOCK = threading.Lock()
_BIND_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* tensorfleet: a bind to the wildcard address becomes a bind to TENSORFLEET_BIND_HOST. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real_bind)(int, const struct sockaddr *, socklen_t);
  if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
  const char *host = getenv("TENSORFLEET_BIND_HOST");
  if (host && addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      struct in_addr v4;
      if (inet_pton(AF_INET, host, &v4) == 1) {  /* an IPv4 host on a dual-stack socket: v4-mapped */
        memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
        a.sin6_addr.s6_addr[10] = 0xff;
        a.sin6_addr.s6_addr[11] = 0xff;
        memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
        return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
      }
      if (inet_pton(AF_INET6, host, &a.sin6_addr) == 1) return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  } else if (host && addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY) && inet_pton(AF_INET, host, &a.sin_addr) == 1)
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
  }
  return real_bind(fd, addr, len);
}
"""


def bind_shim_path() -> Path | None:
    """The ``LD_PRELOAD`` library that binds a worker to one address; built on first use.

    None when there is no C compiler (or it fails).
    """
    digest = hashlib.sha256(_BIND_SHIM_SOURCE.encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensorfleet"
    path = cache / f"bindhost-{digest}.so"
    if path.is_file():
        return path
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src = Path(tmp) / "bindhost.c"
            src.write_text(_BIND_SHIM_SOURCE)
            out = Path(tmp) / "bindhost.so"
            subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"],
                           check=True, capture_output=True, timeout=120)
            os.replace(out, path)  # atomic: another process may build the same file
    except (OSError, subprocess.SubprocessError):
        return None
    return path


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
        os.environ["LD_PRELOAD"] = ":".join(p for p in (str(shim), saved["LD_PRELOAD"]) if p)
        os.environ["TENSORFLEET_BIND_HOST"] = "127.0.0.1" if host == "localhost" else host
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class PortInUseError(OSError):
    """The port a worker was asked to serve on is taken by another process."""


def _check_port(port: Any) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"port must be an integer in [1, 65535]. Received: port={port!r}")
    return port


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raises :class:`PortInUseError` when ``port`` is taken on any interface.

    Bound without ``SO_REUSEPORT``, so a port held by another TFF worker (whose gRPC server
    sets it) counts as taken. ``host`` only names the worker in the message.
    """
    _check_port(port)
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
            raise PortInUseError(
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
        >>> worker = Worker(port=8471).start()
        >>> worker.address, worker.running
        ('127.0.0.1:8471', True)
        >>> worker.stop()
    """

    def __init__(self, port: int | None = None, *, host: str = "127.0.0.1", max_concurrent: int = -1,
                 log_path: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0) -> None:
        if port is not None:
            _check_port(port)
        if host not in _HOSTS:
            raise ValueError(f"host must be 127.0.0.1 (or localhost) or every interface (0.0.0.0, ::): TFF's worker "
                             f"binds one of those. Received: host={host!r}")
        if not isinstance(max_concurrent, int) or isinstance(max_concurrent, bool):
            raise ValueError(f"max_concurrent must be an integer (nonpositive: no limit). "
                             f"Received: max_concurrent={max_concurrent!r}")
        self.host = host
        self._requested_port = port
        self._process = LocalWorker(port=port, max_concurrent_computation_calls=max_concurrent,
                                    log_path=log_path, startup_timeout=startup_timeout)

    @property
    def port(self) -> int | None:
        """The port served on (None before the first start when none was asked for)."""
        return self._process.port if self._process.port is not None else self._requested_port

    @property
    def address(self) -> str:
        """``host:port``, the form :class:`~tensorfleet.federated.Simulation` takes in ``workers``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.running

    @property
    def process(self) -> LocalWorker:
        """The underlying :class:`~tensorfleet.federated.runtime.LocalWorker`."""
        return self._process

    def start(self) -> "Worker":
        """Starts the worker and waits until it serves; returns self.

        Raises:
            PortInUseError: the port is taken.
            RuntimeError: the binary exited or did not serve within ``startup_timeout``.
        """
        if self.running:
            return self
        if self._requested_port is not None:
            check_port_free(self._requested_port, self.host)
        try:
            with _bound_to(self.host):
                self._process.start()
        except RuntimeError as err:
            raise RuntimeError(f"TFF worker on {self.host}:{self._process.port}: {err}") from None
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the worker (SIGINT, SIGKILL after ``timeout``) and reaps it. Idempotent."""
        self._process.stop(timeout)

    def kill(self) -> None:
        """Kills the worker at once (SIGKILL), as a crash would, and reaps it."""
        pid = self.pid
        if pid is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.stop(timeout=5.0)

    def wait(self, timeout: float | None = None) -> int | None:
        """Waits until the worker process exits; its exit status, or None on timeout."""
        process = self._process._process  # noqa: SLF001 - the Popen that LocalWorker owns
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

    Example:
        >>> worker = start_worker(8471)
        >>> sim = Simulation(model_fn, clients, workers=[worker.address, "127.0.0.1:8472"])
    """
    return Worker(port, host=host, max_concurrent=max_concurrent, log_path=log_path).start()


def serve(port: int, *, host: str = "127.0.0.1", max_concurrent: int = -1,
          log_path: str | os.PathLike[str] | None = None,
          on_ready: Callable[[Worker], None] | None = None) -> int:
    """Runs one worker in the foreground until SIGTERM or SIGINT, then stops it; returns 0.

    Returns the worker's exit status instead when it ends by itself.

    Example:
        >>> serve(8471)  # blocks; `kill -TERM` the process to stop the worker
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
