"""Kubernetes manifests for serving a model: a Deployment, a Service and a HorizontalPodAutoscaler.

Each pod runs ``tensorfleet serve MODEL_BASE_PATH`` on every address of its pod, with TF
Serving's ports (gRPC 8500, REST 8501), so the Service answers TF Serving's clients the way a
TF Serving Deployment would. The model's base directory (``BASE/<version>/saved_model.pb``) is in
the image at ``/models/NAME`` (TF Serving's convention), or on a claim mounted there read-only,
where a new version written is picked up by the server while it serves.

Probes use the server's REST endpoints: a startup probe on ``/healthz`` gives the model time to
load, liveness is ``/healthz``, and readiness ``/readyz``, which answers 503 until a version is
loaded, so a pod joins the Service only when it can answer. With ``min_replicas`` and
``max_replicas`` (:class:`PodScaling`) an ``autoscaling/v2`` HorizontalPodAutoscaler scales the Deployment on the pods'
CPU use (``target_cpu`` percent of their request); the Deployment then states no replica count,
as Kubernetes advises, so applying the manifest again leaves the autoscaler's count alone. Every object is checked
against the core Kubernetes schemas (kubernetes-validate) before it is returned or written.

What belongs together is passed together: :class:`PodScaling` (replicas or the autoscaler's
bounds), :class:`ServedModel` (where the model is in the pod and the name clients ask for),
:class:`ServerFlags` (the ports and more ``tensorfleet serve`` flags) and :class:`PodResources`.

Example:
    >>> docs = serving_manifests(name="digits", image="registry.example/digits:1",
    ...                          scaling=PodScaling(min_replicas=2, max_replicas=6))
    >>> [d["kind"] for d in docs]
    ['Deployment', 'Service', 'HorizontalPodAutoscaler']
    >>> docs[0]["spec"]["template"]["spec"]["containers"][0]["command"][:3]
    ['tensorfleet', 'serve', '/models/digits']
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tensorfleet import kube, validation

__all__ = ["GRPC_PORT", "REST_PORT", "PodResources", "PodScaling", "ServedModel", "ServerFlags", "autoscaler",
           "serving_manifests", "validate", "write"]

#: TF Serving's ports, which ``tensorfleet serve`` takes too.
GRPC_PORT = 8500
REST_PORT = 8501
CONTAINER_NAME = "model-server"
# Flags the manifest sets itself; serve_args setting them again would break the ports, probes or name.
_RESERVED = ("--port", "--rest-api-port", "--rest_api_port", "--host", "--model-name", "--model_name")


@dataclass(frozen=True)
class PodScaling:
    """How many server pods: ``replicas`` (default 1), or ``min_replicas`` and ``max_replicas`` together, which
    make a HorizontalPodAutoscaler between them aiming at ``target_cpu`` percent of the pods' CPU request (the
    Deployment then has no replica count of its own, so applying the manifest again leaves the autoscaler's)."""

    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_cpu: int = 80

    def __post_init__(self) -> None:
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("min_replicas and max_replicas go together (they make the HorizontalPodAutoscaler). "
                             f"Received: min_replicas={self.min_replicas}, max_replicas={self.max_replicas}")
        validation.positive_int("target_cpu", self.target_cpu)
        if self.min_replicas is None:
            validation.positive_int("replicas", 1 if self.replicas is None else self.replicas)
            return
        if self.replicas is not None:
            raise ValueError("Give replicas or min_replicas/max_replicas, not both: with an autoscaler the Deployment "
                             "has no replica count of its own (so that applying the manifest again does not reset "
                             f"the autoscaler's). Received: replicas={self.replicas}, "
                             f"min_replicas={self.min_replicas}, max_replicas={self.max_replicas}")
        low = validation.positive_int("min_replicas", self.min_replicas)
        high = validation.positive_int("max_replicas", self.max_replicas)
        if low > high:
            raise ValueError(f"min_replicas must not exceed max_replicas. Received: min_replicas={low}, "
                             f"max_replicas={high}")

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None


@dataclass(frozen=True)
class ServedModel:
    """The model in the pod: its base directory (default ``/models/NAME``, TF Serving's convention), the name
    clients ask for (default NAME), and an existing PersistentVolumeClaim holding the base directory, mounted
    read-only there (default: none, the model is in the image)."""

    base_path: str | None = None
    name: str | None = None
    claim: str | None = None

    def __post_init__(self) -> None:
        if self.base_path is not None and (not isinstance(self.base_path, str) or not self.base_path.startswith("/")):
            raise ValueError(f"base_path must be an absolute path in the pod. Received: base_path={self.base_path!r}")
        name = self.name
        if name is not None and (not isinstance(name, str) or not name or "/" in name
                                 or any(c.isspace() for c in name)):
            raise ValueError("The model's name must be a non-empty name without '/' or spaces. Received: "
                             f"name={name!r}")
        if self.claim is not None:
            kube.dns_subdomain("claim", self.claim)


@dataclass(frozen=True)
class ServerFlags:
    """``tensorfleet serve``'s ports (TF Serving's 8500 for gRPC and 8501 for REST, also the Service's) and
    more flags for it (``("--enable-batching", "--max-batch-size", "32")``)."""

    grpc_port: int = GRPC_PORT
    rest_port: int = REST_PORT
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validation.port("grpc_port", self.grpc_port)
        validation.port("rest_port", self.rest_port)
        if self.grpc_port == self.rest_port:
            raise ValueError(f"grpc_port and rest_port must differ. Received: grpc_port={self.grpc_port}, "
                             f"rest_port={self.rest_port}")
        args = self.args
        if isinstance(args, str) or not all(isinstance(a, str) and a for a in args):
            raise ValueError(f"args must be a list of non-empty strings. Received: args={args!r}")
        for arg in args:
            if arg.split("=", 1)[0] in _RESERVED:
                raise ValueError(f"args must not set {arg.split('=', 1)[0]}: the manifest sets it (the model's name "
                                 "with ServedModel(name=...), the ports with grpc_port and rest_port). "
                                 f"Received: {arg!r}")
        object.__setattr__(self, "args", tuple(args))


@dataclass(frozen=True)
class PodResources:
    """Each server pod's CPU and memory, requested and set as its limits (Kubernetes quantities)."""

    cpu: str = "1"
    memory: str = "2Gi"

    def __post_init__(self) -> None:
        kube.resources(self.cpu, self.memory)


def _group(name: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, such as {name}={kind.__name__}(). "
                        f"Received: {name}={value!r}")
    return value


def _container(image: str, command: list[str], grpc_port: int, rest_port: int, cpu: str, memory: str,
               mount: str | None) -> dict[str, Any]:
    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        # A server busy with a batch may take a moment to answer: 5 s before a probe counts as failed.
        return {"httpGet": {"path": path, "port": "rest"}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": failures}

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": command,
        "ports": [{"name": "grpc", "containerPort": grpc_port, "protocol": "TCP"},
                  {"name": "rest", "containerPort": rest_port, "protocol": "TCP"}],
        "env": kube.env_list({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}),
        # Loading a SavedModel takes a while: up to 60 x 5 s before liveness starts counting.
        "startupProbe": probe("/healthz", 5, 60),
        "livenessProbe": probe("/healthz", 10, 3),
        "readinessProbe": probe("/readyz", 5, 3),
        "resources": kube.resources(cpu, memory),
    }
    if mount is not None:
        container["volumeMounts"] = [{"name": "models", "mountPath": mount, "readOnly": True}]
    return container


def autoscaler(name: str, *, namespace: str, labels: Mapping[str, str], min_replicas: int, max_replicas: int,
               target_cpu: int) -> dict[str, Any]:
    """An ``autoscaling/v2`` HorizontalPodAutoscaler of Deployment ``name`` on its pods' CPU use.

    Example:
        >>> hpa = autoscaler("digits", namespace="default", labels={"app": "digits"}, min_replicas=1,
        ...                  max_replicas=4, target_cpu=70)
        >>> hpa["spec"]["metrics"][0]["resource"]["target"]
        {'type': 'Utilization', 'averageUtilization': 70}
    """
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": target_cpu}}}],
        },
    }


def serving_manifests(*, name: str, image: str, namespace: str = "default", scaling: PodScaling = PodScaling(),
                      model: ServedModel = ServedModel(), server: ServerFlags = ServerFlags(),
                      resources: PodResources = PodResources()) -> list[dict[str, Any]]:
    """The Deployment running ``tensorfleet serve``, its Service and (with min/max replicas) its autoscaler.

    Args:
        name: name of every object and the ``app`` label (a DNS label).
        image: container image with tensorfleet and, unless ``model.claim`` is given, the model.
        namespace: the objects' namespace.
        scaling: a fixed number of pods, or an autoscaler's bounds and target (:class:`PodScaling`).
        model: where the model is in the pod and the name clients ask for (:class:`ServedModel`).
        server: the server's ports and more ``tensorfleet serve`` flags (:class:`ServerFlags`).
        resources: each pod's requests and limits (:class:`PodResources`).

    Raises:
        ValueError: a bad argument, named with the value received (a group's own, when it is made).
        TypeError: a group that is not its option class.
    """
    kube.dns_label("name", name)
    kube.image(image)
    kube.dns_label("namespace", namespace)
    scaling = _group("scaling", scaling, PodScaling)
    model = _group("model", model, ServedModel)
    server = _group("server", server, ServerFlags)
    resources = _group("resources", resources, PodResources)
    base = f"/models/{name}" if model.base_path is None else model.base_path
    command = ["tensorfleet", "serve", base, "--model-name", model.name or name, "--host", "0.0.0.0",
               "--port", str(server.grpc_port), "--rest-api-port", str(server.rest_port), *server.args]
    labels = kube.app_labels(name, "model-server")
    container = _container(image, command, server.grpc_port, server.rest_port, resources.cpu, resources.memory,
                           base if model.claim else None)
    volumes = [{"name": "models", "persistentVolumeClaim": {"claimName": model.claim, "readOnly": True}}
               ] if model.claim else []
    replicas = None if scaling.autoscaled else (scaling.replicas or 1)
    docs = [kube.deployment(name, namespace=namespace, labels=labels, replicas=replicas, containers=[container],
                            volumes=volumes),
            kube.service(name, namespace=namespace, labels=labels,
                         ports={"grpc": server.grpc_port, "rest": server.rest_port})]
    if scaling.min_replicas is not None and scaling.max_replicas is not None:  # scaling.autoscaled
        docs.append(autoscaler(name, namespace=namespace, labels=labels, min_replicas=scaling.min_replicas,
                               max_replicas=scaling.max_replicas, target_cpu=scaling.target_cpu))
    validate(docs)
    return docs


def validate(docs: kube.Manifest) -> None:
    """Checks every document against the Kubernetes schemas; raises :class:`~tensorfleet.kube.ManifestError`."""
    kube.validate(docs, expected="a Deployment and a Service")


def write(docs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Validates ``docs`` and writes them as one YAML file, atomically."""
    return kube.write(docs, path, check=validate)
