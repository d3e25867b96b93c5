"""Kubernetes manifests for N federated workers: a Deployment and a headless Service.

Each pod runs ``tensorfleet federated worker`` on one port: TFF's ``worker_binary`` (``runtime="tff"``,
for ``backend="tff"``: the tff track) or a TensorFlow server (``runtime="tensorflow"``, for
``backend="compiled"`` with workers: the current track). The
headless Service (``clusterIP: None``) gives no load balancer: its DNS name resolves to the
address of every ready pod, which is the list a simulation takes as ``workers``
(:func:`worker_addresses` resolves it from inside the cluster). A readiness probe on the
worker's port keeps starting pods out of that list. The manifests are checked against the
Kubernetes schemas (kubernetes-validate) before they are returned or written.

Example:
    >>> docs = federated_workers(replicas=4, image="registry.example/tensorfleet:1")
    >>> [d["kind"] for d in docs]
    ['Deployment', 'Service']
    >>> path = write(docs, "tff-workers.yaml")
    >>> path.read_text().count("kind: ")
    2
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

from tensorfleet import kube, validation
from tensorfleet.federated.backends.addresses import WorkerRuntime

__all__ = ["DEFAULT_PORT", "federated_workers", "validate", "worker_addresses", "write"]

DEFAULT_PORT = 8000
#: Per runtime: the container's (and port's) name, and the default name of the Deployment and Service.
_NAMES = {WorkerRuntime.TFF: ("tff-worker", "tff-workers"), WorkerRuntime.TENSORFLOW: ("tf-worker", "tf-workers")}
PORT_NAME = _NAMES[WorkerRuntime.TFF][0]


def federated_workers(*, replicas: int, image: str, name: str | None = None, namespace: str = "default",
                      port: int = DEFAULT_PORT, max_concurrent: int = -1, cpu: str = "1", memory: str = "2Gi",
                      command: Sequence[str] | None = None,
                      runtime: WorkerRuntime | str = WorkerRuntime.TFF) -> list[dict[str, Any]]:
    """A Deployment of ``replicas`` federated workers and the headless Service in front of them.

    Args:
        replicas: number of worker pods.
        image: container image with tensorfleet (and, for ``runtime="tff"``, TFF's worker_binary) installed.
        name: name of the Deployment, the Service and the ``app`` label (default ``tff-workers``, or
            ``tf-workers`` for ``runtime="tensorflow"``).
        namespace: their namespace.
        port: the port every worker serves on.
        max_concurrent: the TFF worker's ``--max-concurrent`` (nonpositive: no limit; tff only).
        cpu, memory: each pod's requests and limits.
        command: the container's command; ``tensorfleet federated worker ...`` by default.
        runtime: ``"tff"`` (TFF's C++ workers) or ``"tensorflow"`` (TensorFlow servers, each
            ``tensorfleet federated worker --runtime tensorflow``).

    Example:
        >>> deployment, service = federated_workers(replicas=2, image="tensorfleet:1")
        >>> service["spec"]["clusterIP"]
        'None'
    """
    kind = validation.choice(WorkerRuntime, "runtime", runtime)
    worker, default_name = _NAMES[kind]
    name = default_name if name is None else name
    validation.positive_int("replicas", replicas)
    kube.image(image)
    kube.dns_label("name", name)
    kube.dns_label("namespace", namespace)
    validation.port("port", port)
    labels = kube.app_labels(name, worker)
    container = {
        "name": worker,
        "image": image,
        "command": list(command) if command is not None else _worker_command(kind, port, max_concurrent),
        "ports": [{"name": worker, "containerPort": port, "protocol": "TCP"}],
        "env": kube.env_list({"TF_CPP_MIN_LOG_LEVEL": "2"}),
        "readinessProbe": {"tcpSocket": {"port": worker}, "initialDelaySeconds": 2, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": worker}, "initialDelaySeconds": 30, "periodSeconds": 20},
        "resources": kube.resources(cpu, memory),
    }
    # The worker stops on SIGTERM; its grace period gives it time to end its computation.
    deployment = kube.deployment(name, namespace=namespace, labels=labels, replicas=replicas, containers=[container],
                                 grace_seconds=30)
    service = kube.service(name, namespace=namespace, labels=labels, ports={worker: port}, headless=True)
    docs = [deployment, service]
    validate(docs)
    return docs


def _worker_command(runtime: WorkerRuntime, port: int, max_concurrent: int) -> list[str]:
    argv = ["tensorfleet", "federated", "worker", "--port", str(port), "--host", "0.0.0.0"]
    if runtime is WorkerRuntime.TFF:
        return [*argv, "--runtime", "tff", "--max-concurrent", str(int(max_concurrent))]
    if max_concurrent != -1:
        raise ValueError(f"max_concurrent (--max-concurrent) applies to TFF's workers (runtime='tff'), not to "
                         f"TensorFlow servers. Received: max_concurrent={max_concurrent!r} with runtime='tensorflow'")
    return [*argv, "--runtime", "tensorflow"]


def validate(docs: Sequence[Mapping[str, Any]]) -> None:
    """Checks every document against the Kubernetes schemas; raises :class:`~tensorfleet.kube.ManifestError`."""
    kube.validate(docs, expected="a Deployment and a Service")


def write(docs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Validates ``docs`` and writes them as one YAML file, atomically."""
    return kube.write(docs, path, check=validate)


def worker_addresses(service: str = "tff-workers", *, namespace: str = "default", port: int = DEFAULT_PORT,
                     domain: str = "svc.cluster.local") -> list[str]:
    """``ip:port`` of every ready worker behind the headless Service (run inside the cluster).

    Any resolvable name works (``domain=""`` takes it as it is), e.g. this machine's:

        >>> worker_addresses("localhost", domain="", port=8000)
        ['127.0.0.1:8000'...]

    Example (needs a Kubernetes cluster with the workers' Service, and data and a model):
        >>> Simulation(model_fn, clients, workers=worker_addresses("tff-workers"))  # doctest: +SKIP
    """
    host = f"{service}.{namespace}.{domain}" if domain else service
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"The worker Service's name does not resolve ({exc.strerror}); is this inside the cluster "
                         f"and are workers ready? Received: {host!r}") from None
    ips = sorted({str(info[4][0]) for info in infos})
    return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in ips]
