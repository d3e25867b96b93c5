"""Keep a child process's wildcard listening sockets on one address.

TensorFlow's gRPC server (``tf.distribute.Server``, every task of a cluster) and TFF's C++
worker bind ``[::]:port``, every interface, with no option to choose; the address is
hard-coded in their binaries. A task that should serve only 127.0.0.1 is therefore started
with a tiny ``LD_PRELOAD`` library that turns a bind to the wildcard address into a bind to
``TENSORFLEET_BIND_HOST`` (an IPv4 host on a dual-stack socket becomes its v4-mapped address,
so clients of ``127.0.0.1:port`` still connect). It is compiled with the machine's C compiler
on first use into ``~/.cache/tensorfleet``; without a compiler, :func:`bind_shim_path` returns
None and callers warn.
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
