"""Addresses of federated workers, the runtimes they run, and the errors that name one.

A worker is reached at ``host:port`` (``[::1]:port`` for IPv6); :func:`parse_addresses` takes a
list or one comma-separated string and refuses an empty list or a repeated address. The errors
of a multi-worker run (:mod:`~tensorfleet.federated.backends.remote`) derive from
:class:`WorkerError` and carry the worker's ``address``.

Example:
    >>> parse_addresses("127.0.0.1:8471, [::1]:8472")
    [WorkerAddress(host='127.0.0.1', port=8471), WorkerAddress(host='::1', port=8472)]
    >>> parse_addresses(["127.0.0.1:8471", "127.0.0.1:8471"])
    Traceback (most recent call last):
    ValueError: workers must not repeat an address. Received: '127.0.0.1:8471' twice in workers=['127.0.0.1:8471',
    '127.0.0.1:8471']
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "AllWorkersLostError", "WorkerAddress", "WorkerError", "WorkerRuntime", "WorkerLostError", "WorkerUnreachableError",
    "WorkerVersionError", "parse_address", "parse_addresses",
]


class WorkerRuntime(str, Enum):
    """What a federated worker runs: a TensorFlow server (``backend="compiled"`` with workers, the current
    track) or TFF's C++ worker_binary (``backend="tff"``, the tff track)."""

    TENSORFLOW = "tensorflow"
    TFF = "tff"


class WorkerError(RuntimeError):
    """Base of the errors about one worker; ``address`` names it."""

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address


class WorkerUnreachableError(WorkerError):
    """Nothing answers as a gRPC server at the worker's address."""


class WorkerVersionError(WorkerError):
    """A gRPC server answers at the address, but not as a TFF worker of the installed version."""


class WorkerLostError(WorkerError):
    """A worker stopped answering while a computation ran on it."""


class AllWorkersLostError(RuntimeError):
    """Every worker of a distributed context is lost; the run cannot go on."""


@dataclass(frozen=True)
class WorkerAddress:
    """``host:port`` of one worker."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """The gRPC target (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(address: Any) -> WorkerAddress:
    """Parses ``"host:port"`` (``"[::1]:port"`` for IPv6) into a :class:`WorkerAddress`.

    Example:
        >>> parse_address("127.0.0.1:8471")
        WorkerAddress(host='127.0.0.1', port=8471)
    """
    if isinstance(address, WorkerAddress):
        return address
    hint = "Worker addresses are HOST:PORT with a port in [1, 65535], e.g. '127.0.0.1:8471'."
    if not isinstance(address, str):
        raise TypeError(f"{hint} Received: {address!r} of type {type(address).__name__}")
    text = address.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep and rest.startswith(":"))
    else:
        host, sep, port_text = text.rpartition(":")
        ok = bool(sep) and ":" not in host
    if not ok or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{hint} Received: {address!r}")
    return WorkerAddress(host, int(port_text))


def parse_addresses(addresses: Any) -> list[WorkerAddress]:
    """Parses a list of addresses, or one comma-separated string; refuses empty lists and repeats."""
    if isinstance(addresses, str):
        addresses = [a for a in addresses.split(",") if a.strip()]
    if not isinstance(addresses, (list, tuple)) or not addresses:
        raise ValueError(f"workers must be a non-empty list of HOST:PORT addresses. Received: workers={addresses!r}")
    parsed = [parse_address(a) for a in addresses]
    seen: set[WorkerAddress] = set()
    for a in parsed:
        if a in seen:
            raise ValueError(f"workers must not repeat an address. Received: {str(a)!r} twice in workers={addresses!r}")
        seen.add(a)
    return parsed
