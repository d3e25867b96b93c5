"""Cluster specs and TF_CONFIG, typed and validated.

A tf.distribute cluster is a dict of task types (``chief``, ``worker``, ``ps``,
``evaluator``) to lists of ``host:port`` addresses; every process gets a TF_CONFIG naming
the cluster and its own task. :class:`ClusterSpec` builds one (hosts default to 127.0.0.1,
ports come free from portpicker), :func:`parse_tf_config` checks one a user wrote, with one
clear :class:`TFConfigError` for each way it can be wrong.

Example:
    >>> spec = ClusterSpec.local(workers=2, ps=1)
    >>> config = spec.tf_config("worker", 1)
    >>> config["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator, Mapping

from tensorfleet.validation import integer

__all__ = [
    "ClusterSpec",
    "Role",
    "Task",
    "TFConfig",
    "TFConfigError",
    "parse_tf_config",
    "tf_config_from_env",
]

DEFAULT_HOST = "127.0.0.1"


class Role(str, Enum):
    """Task types of a tf.distribute cluster."""

    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"


ROLES = tuple(r.value for r in Role)


class TFConfigError(ValueError):
    """A TF_CONFIG or cluster spec that tf.distribute cannot use."""


@dataclass(frozen=True)
class Task:
    """One task of a cluster: its role, its index within the role and its address."""

    role: str
    index: int
    address: str

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def __str__(self) -> str:
        return f"{self.role}:{self.index}"


def _check_address(role: str, index: int, address: Any) -> str:
    where = f"cluster[{role!r}][{index}]"
    if not isinstance(address, str) or ":" not in address:
        raise TFConfigError(f"{where} must be a 'host:port' string. Received: {address!r}")
    host, port = address.rsplit(":", 1)
    if not host:
        raise TFConfigError(f"{where} has an empty host. Received: {address!r}")
    if not port.isdigit():
        raise TFConfigError(f"{where} has a port that is not a number. Received: {address!r}; expected e.g. "
                            f"'{host}:2222'")
    if not 0 < int(port) < 65536:
        raise TFConfigError(f"{where} has a port outside 1..65535. Received: {address!r}")
    return address


@functools.lru_cache(maxsize=256)
def _host_addresses(host: str) -> frozenset[str]:
    """The addresses ``host`` stands for; every loopback address counts as one, ``"loopback"``.

    TensorFlow's servers listen on every interface (``[::]:port``), so two loopback addresses
    with one port are one listening socket. A name that does not resolve stands for itself.
    """
    name = host.strip("[]").lower()
    try:
        candidates = {name} if _is_ip(name) else {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return frozenset({name})
    addresses = set()
    for candidate in candidates:
        ip = ipaddress.ip_address(candidate.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        addresses.add("loopback" if ip.is_loopback else str(ip))
    return frozenset(addresses)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _check_distinct_hosts(tasks: list[tuple[str, str]]) -> None:
    """No two tasks (name, address) with one port on hosts that are one machine's address.

    Only tasks that share a port are resolved, so a cluster of distinct ports does no lookup.
    """
    by_port: dict[str, list[tuple[str, str]]] = {}
    for name, address in tasks:
        by_port.setdefault(address.rsplit(":", 1)[1], []).append((name, address))
    for group in by_port.values():
        for i, (name, address) in enumerate(group):
            mine = _host_addresses(address.rsplit(":", 1)[0])
            for other_name, other in group[:i]:
                shared = mine & _host_addresses(other.rsplit(":", 1)[0])
                if shared:
                    what = "loopback addresses" if "loopback" in shared else f"{', '.join(sorted(shared))}"
                    raise TFConfigError(
                        f"Two tasks share one address: {other_name} at {other!r} and {name} at {address!r} are "
                        f"the same host ({what}) and port. Every task needs its own host:port."
                    )


@dataclass(frozen=True)
class ClusterSpec:
    """An immutable, validated cluster: role -> list of ``host:port`` addresses.

    Build one with :meth:`local` (free ports on one host) or from a mapping; invalid specs
    (unknown roles, bad addresses, two tasks on one address, several chiefs) raise
    :class:`TFConfigError`. Two addresses are one when their hosts are the same machine's:
    ``localhost``, ``127.0.0.1`` and ``::1``, or two names that resolve to one address.
    """

    jobs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, Mapping) or not self.jobs:
            raise TFConfigError(f"A cluster needs at least one task type. Received: cluster={self.jobs!r}")
        normalised: dict[str, tuple[str, ...]] = {}
        seen: dict[str, str] = {}
        for role, addresses in self.jobs.items():
            if role not in ROLES:
                raise TFConfigError(
                    f"Unknown task type {role!r} in the cluster. Expected one of: {', '.join(ROLES)}."
                )
            if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)):
                raise TFConfigError(
                    f"cluster[{role!r}] must be a list of 'host:port' strings. Received: {addresses!r}"
                )
            if not addresses:
                raise TFConfigError(f"cluster[{role!r}] is empty; drop the task type or give it addresses.")
            checked = tuple(_check_address(role, i, a) for i, a in enumerate(addresses))
            for i, address in enumerate(checked):
                if address in seen:
                    raise TFConfigError(
                        f"Two tasks share the address {address!r}: {seen[address]} and {role}:{i}. "
                        "Every task needs its own host:port."
                    )
                seen[address] = f"{role}:{i}"
            normalised[role] = checked
        _check_distinct_hosts([(task, address) for address, task in seen.items()])
        for single in (Role.CHIEF.value, Role.EVALUATOR.value):
            if len(normalised.get(single, ())) > 1:
                raise TFConfigError(
                    f"A cluster has at most one {single}. Received {len(normalised[single])}: "
                    f"{list(normalised[single])}"
                )
        # Keep a canonical role order so that specs compare and serialise stably.
        object.__setattr__(self, "jobs", {r: normalised[r] for r in ROLES if r in normalised})

    @classmethod
    def local(
        cls,
        *,
        workers: int = 1,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        host: str = DEFAULT_HOST,
        ports: list[int] | None = None,
    ) -> "ClusterSpec":
        """A cluster on one host with free ports from portpicker (or the ``ports`` given).

        Ports are assigned in task order: chief, workers, ps, evaluator.
        """
        integer("workers", workers, minimum=0)
        integer("ps", ps, minimum=0)
        if workers == 0 and not chief:
            raise ValueError("A cluster needs at least one worker or a chief. Received: workers=0, chief=False")
        counts = [(Role.CHIEF.value, int(chief)), (Role.WORKER.value, workers), (Role.PS.value, ps),
                  (Role.EVALUATOR.value, int(evaluator))]
        total = sum(n for _, n in counts)
        if ports is None:
            import portpicker

            ports = [portpicker.pick_unused_port() for _ in range(total)]
        elif len(ports) != total:
            raise ValueError(f"ports must list one port per task ({total}). Received {len(ports)}: {ports}")
        it = iter(ports)
        jobs = {role: tuple(f"{host}:{next(it)}" for _ in range(n)) for role, n in counts if n}
        return cls(jobs)

    def as_dict(self) -> dict[str, list[str]]:
        return {role: list(addresses) for role, addresses in self.jobs.items()}

    def num_tasks(self, role: str | None = None) -> int:
        if role is None:
            return sum(len(a) for a in self.jobs.values())
        return len(self.jobs.get(role, ()))

    def tasks(self) -> Iterator[Task]:
        for role, addresses in self.jobs.items():
            for index, address in enumerate(addresses):
                yield Task(role, index, address)

    def task(self, role: str, index: int) -> Task:
        if role not in self.jobs:
            raise TFConfigError(
                f"Task type {role!r} is not in the cluster, which has: {', '.join(self.jobs)}."
            )
        n = len(self.jobs[role])
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise TFConfigError(
                f"Task index {index!r} is out of range for {role!r}, which has {n} task(s) (0..{n - 1})."
            )
        return Task(role, index, self.jobs[role][index])

    def tf_config(self, role: str, index: int, *, rpc_layer: str | None = None) -> dict[str, Any]:
        """The TF_CONFIG dict for one task (validated)."""
        self.task(role, index)
        config: dict[str, Any] = {"cluster": self.as_dict(), "task": {"type": role, "index": index}}
        if rpc_layer:
            config["rpc_layer"] = rpc_layer
        return config

    def tf_config_json(self, role: str, index: int) -> str:
        return json.dumps(self.tf_config(role, index))

    def to_tf(self) -> Any:
        """The equivalent ``tf.train.ClusterSpec``."""
        import tensorflow as tf

        return tf.train.ClusterSpec(self.as_dict())


@dataclass(frozen=True)
class TFConfig:
    """A parsed and validated TF_CONFIG."""

    cluster: ClusterSpec
    task: Task | None
    rpc_layer: str | None = None

    @property
    def has_ps(self) -> bool:
        return self.cluster.num_tasks(Role.PS.value) > 0

    @property
    def num_workers(self) -> int:
        """Workers that train: workers plus the chief."""
        return self.cluster.num_tasks(Role.WORKER.value) + self.cluster.num_tasks(Role.CHIEF.value)


def parse_tf_config(value: str | Mapping[str, Any]) -> TFConfig:
    """Validates a TF_CONFIG given as a JSON string or a dict.

    Raises:
        TFConfigError: malformed JSON, no cluster, a task type absent from the cluster, an
            index out of range, a port that is not a number, two tasks on one address.
    """
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TFConfigError(
                f"TF_CONFIG is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}). "
                f"Received: {text[:200]!r}"
            ) from None
    if not isinstance(value, Mapping):
        raise TFConfigError(f"TF_CONFIG must be a JSON object. Received: {value!r}")
    if "cluster" not in value or not value["cluster"]:
        raise TFConfigError(
            "TF_CONFIG has no 'cluster'. Expected e.g. "
            '{"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}'
        )
    cluster_value = value["cluster"]
    if not isinstance(cluster_value, Mapping):
        raise TFConfigError(f"TF_CONFIG 'cluster' must be an object. Received: {cluster_value!r}")
    cluster = ClusterSpec(dict(cluster_value))
    task_value = value.get("task")
    task = None
    if task_value:
        if not isinstance(task_value, Mapping) or "type" not in task_value:
            raise TFConfigError(f"TF_CONFIG 'task' must be an object with 'type' and 'index'. Received: {task_value!r}")
        index = task_value.get("index", 0)
        task = cluster.task(task_value["type"], index)
    return TFConfig(cluster=cluster, task=task, rpc_layer=value.get("rpc_layer"))


def tf_config_from_env(environ: Mapping[str, str] | None = None) -> TFConfig | None:
    """The validated TF_CONFIG of the environment, or None when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if not raw.strip():
        return None
    parsed = parse_tf_config(raw)
    return parsed
