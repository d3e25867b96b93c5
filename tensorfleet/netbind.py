"""Keep a child process's wildcard listening sockets on one address.

TensorFlow's gRPC server (``tf.distribute.Server``, every task of a cluster) and TFF's C++
worker bind ``[::]:port``, every interface, with no option to choose; the address is
hard-coded in their binaries. A task that should serve only 127.0.0.1 is therefore started
with a tiny ``LD_PRELOAD`` library that turns a bind to the wildcard address into a bind to
``TENSORFLEET_BIND_HOST`` (an IPv4 host on a dual-stack socket becomes its v4-mapped address,
so clients of ``127.0.0.1:port`` still connect). It is compiled with the machine's C compiler
on first use into ``~/.cache/tensorfleet``; without a compiler, :func:`bind_shim_path` returns
None and callers warn.

A library preloaded into every task must be the one tensorfleet built: the cached file is named
after the hash of its source, the compiler and the flags (a new compiler or source builds a new
one), and the SHA-256 of the built library is recorded beside it (``<name>.so.sha256``). Before
each use the file is hashed again; a file that does not match its record (changed, truncated,
replaced) or has no record is rebuilt, and one that cannot be rebuilt is not used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["bind_shim_path", "loopback_env"]

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


_FLAGS = ("-shared", "-fPIC", "-O2")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build_key(compiler: str) -> str:
    """Hash of what decides the library's bytes: source, flags and the compiler (path, size, mtime)."""
    real = os.path.realpath(compiler)
    stat = os.stat(real)
    identity = f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0{' '.join(_FLAGS)}\0{_BIND_SHIM_SOURCE}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _verified(path: Path, record: Path) -> bool:
    try:
        return record.read_text().split()[0] == _sha256(path)
    except (OSError, IndexError):
        return False


def bind_shim_path() -> Path | None:
    """The ``LD_PRELOAD`` library that binds a worker to one address; built on first use.

    The cached library is used only when its SHA-256 matches the one recorded when it was
    built; otherwise it is built again. None when there is no C compiler (or it fails).
    """
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensorfleet"
    try:
        path = cache / f"bindhost-{_build_key(compiler)}.so"
        record = path.with_name(path.name + ".sha256")
        if path.is_file() and _verified(path, record):
            return path
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src = Path(tmp) / "bindhost.c"
            src.write_text(_BIND_SHIM_SOURCE)
            out = Path(tmp) / "bindhost.so"
            subprocess.run([compiler, *_FLAGS, "-o", str(out), str(src), "-ldl"],
                           check=True, capture_output=True, timeout=120)
            digest_file = Path(tmp) / "bindhost.so.sha256"
            digest_file.write_text(f"{_sha256(out)}  {path.name}\n")
            # Atomic, library first: a concurrent reader sees an old record fail and rebuilds.
            os.replace(out, path)
            os.replace(digest_file, record)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if _verified(path, record) else None


def loopback_env(host: str = "127.0.0.1", *, shim: Path | None = None,
                 environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment entries that make a child's wildcard binds go to ``host``.

    Empty when the library cannot be built. ``environ`` (default this process's) supplies an
    ``LD_PRELOAD`` to keep after the library.
    """
    shim = shim or bind_shim_path()
    if shim is None:
        return {}
    previous = (os.environ if environ is None else environ).get("LD_PRELOAD")
    return {"LD_PRELOAD": ":".join(p for p in (str(shim), previous) if p), "TENSORFLEET_BIND_HOST": host}
