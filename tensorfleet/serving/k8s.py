"""Kubernetes manifests for serving a model: a Deployment, a Service and a HorizontalPodAutoscaler.

Each pod runs ``tensorfleet serve MODEL_BASE_PATH`` on every address of its pod, with TF
Serving's ports (gRPC 8500, REST 8501), so the Service answers TF Serving's clients the way a
TF Serving Deployment would. The model's base directory (``BASE/<version>/saved_model.pb``) is in
the image at ``/models/NAME`` (TF Serving's convention), or on a claim mounted there read-only,
where a new version written is picked up by the server while it serves.

Probes use the server's REST endpoints: a startup probe on ``/healthz`` gives the model time to
load, liveness is ``/healthz``, and readiness ``/readyz``, which answers 503 until a version is
loaded, so a pod joins the Service only when it can answer. With ``min_replicas`` and
``max_replicas`` an ``autoscaling/v2`` HorizontalPodAutoscaler scales the Deployment on the pods'
CPU use (``target_cpu`` percent of their request); the Deployment then states no replica count,
as Kubernetes advises, so applying the manifest again leaves the autoscaler's count alone. Every object is checked against the core
Kubernetes schemas (kubernetes-validate) before it is returned or written.

Example:
    >>> docs = serving_manifests(name="digits", image="registry.example/digits:1", min_replicas=2, max_replicas=6)
    >>> [d["kind"] for d in docs]
    ['Deployment', 'Service', 'HorizontalPodAutoscaler']
    >>> docs[0]["spec"]["template"]["spec"]["containers"][0]["command"][:3]
    ['tensorfleet', 'serve', '/models/digits']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from tensorfleet import kube, validation

__all__ = ["GRPC_PORT", "REST_PORT", "autoscaler", "serving_manifests", "validate", "write"]

#: TF Serving's ports, which ``tensorfleet serve`` takes too.
GRPC_PORT = 8500
REST_PORT = 8501
CONTAINER_NAME = "model-server"
# Flags the manifest sets itself; serve_args setting them again would break the ports, probes or name.
_RESERVED = ("--port", "--rest-api-port", "--rest_api_port", "--host", "--model-name", "--model_name")


def _replica_range(replicas: int | None, min_replicas: int | None,
                   max_replicas: int | None) -> tuple[int | None, int | None, int | None]:
    """The Deployment's replicas (None: the autoscaler's to set) and the autoscaler's bounds
    (None: no autoscaler), checked."""
    if (min_replicas is None) != (max_replicas is None):
        raise ValueError("min_replicas and max_replicas go together (they make the HorizontalPodAutoscaler). "
                         f"Received: min_replicas={min_replicas}, max_replicas={max_replicas}")
    if min_replicas is None:
        return validation.positive_int("replicas", 1 if replicas is None else replicas), None, None
    if replicas is not None:
        raise ValueError("Give replicas or min_replicas/max_replicas, not both: with an autoscaler the Deployment "
                         "has no replica count of its own (so that applying the manifest again does not reset the "
                         f"autoscaler's). Received: replicas={replicas}, min_replicas={min_replicas}, "
                         f"max_replicas={max_replicas}")
    low = validation.positive_int("min_replicas", min_replicas)
    high = validation.positive_int("max_replicas", max_replicas)
    if low > high:
        raise ValueError(f"min_replicas must not exceed max_replicas. Received: min_replicas={low}, "
                         f"max_replicas={high}")
    return None, low, high


def _serve_args(serve_args: Sequence[str]) -> list[str]:
    if isinstance(serve_args, str) or not all(isinstance(a, str) and a for a in serve_args):
        raise ValueError(f"serve_args must be a list of non-empty strings. Received: serve_args={serve_args!r}")
    for arg in serve_args:
        if arg.split("=", 1)[0] in _RESERVED:
            raise ValueError(f"serve_args must not set {arg.split('=', 1)[0]}: the manifest sets it (name it with "
                             f"model_name, the ports with grpc_port and rest_port). Received: {arg!r}")
    return list(serve_args)


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


def serving_manifests(*, name: str, image: str, replicas: int | None = None, namespace: str = "default",
                      model_base_path: str | None = None, model_name: str | None = None,
                      min_replicas: int | None = None, max_replicas: int | None = None, target_cpu: int = 80,
                      grpc_port: int = GRPC_PORT, rest_port: int = REST_PORT, cpu: str = "1", memory: str = "2Gi",
                      model_claim: str | None = None, serve_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The Deployment running ``tensorfleet serve``, its Service and (with min/max replicas) its autoscaler.

    Args:
        name: name of every object and the ``app`` label (a DNS label).
        image: container image with tensorfleet and, unless ``model_claim`` is given, the model.
        replicas: pods of the Deployment (default 1); with ``min_replicas``/``max_replicas`` the
            autoscaler sets it instead.
        namespace: the objects' namespace.
        model_base_path: the model's base directory in the pod (default ``/models/NAME``).
        model_name: the name clients ask for (default ``name``).
        min_replicas, max_replicas: together, a HorizontalPodAutoscaler between them.
        target_cpu: the autoscaler's target: average CPU use, percent of the pods' CPU request.
        grpc_port, rest_port: the server's ports (TF Serving's 8500 and 8501), also the Service's.
        cpu, memory: each pod's requests and limits.
        model_claim: an existing PersistentVolumeClaim holding the base directory, mounted read-only
            at ``model_base_path``.
        serve_args: more ``tensorfleet serve`` flags (``["--enable-batching", "--max-batch-size", "32"]``).

    Raises:
        ValueError: a bad argument, named with the value received.
    """
    kube.dns_label("name", name)
    kube.image(image)
    kube.dns_label("namespace", namespace)
    replicas, min_replicas, max_replicas = _replica_range(replicas, min_replicas, max_replicas)
    target_cpu = validation.positive_int("target_cpu", target_cpu)
    validation.port("grpc_port", grpc_port)
    validation.port("rest_port", rest_port)
    if grpc_port == rest_port:
        raise ValueError(f"grpc_port and rest_port must differ. Received: grpc_port={grpc_port}, rest_port={rest_port}")
    base = f"/models/{name}" if model_base_path is None else model_base_path
    if not isinstance(base, str) or not base.startswith("/"):
        raise ValueError(f"model_base_path must be an absolute path in the pod. Received: model_base_path={base!r}")
    model_name = name if model_name is None else model_name
    if not isinstance(model_name, str) or not model_name or "/" in model_name or any(c.isspace() for c in model_name):
        raise ValueError(f"model_name must be a non-empty name without '/' or spaces. Received: model_name={model_name!r}")
    if model_claim is not None:
        kube.dns_subdomain("model_claim", model_claim)
    command = ["tensorfleet", "serve", base, "--model-name", model_name, "--host", "0.0.0.0",
               "--port", str(grpc_port), "--rest-api-port", str(rest_port), *_serve_args(serve_args)]
    labels = kube.app_labels(name, "model-server")
    container = _container(image, command, grpc_port, rest_port, cpu, memory, base if model_claim else None)
    volumes = [{"name": "models", "persistentVolumeClaim": {"claimName": model_claim, "readOnly": True}}
               ] if model_claim else []
    docs = [kube.deployment(name, namespace=namespace, labels=labels, replicas=replicas, containers=[container],
                            volumes=volumes),
            kube.service(name, namespace=namespace, labels=labels, ports={"grpc": grpc_port, "rest": rest_port})]
    if min_replicas is not None:
        docs.append(autoscaler(name, namespace=namespace, labels=labels, min_replicas=min_replicas,
                               max_replicas=max_replicas, target_cpu=target_cpu))
    validate(docs)
    return docs


def validate(docs: kube.Manifest) -> None:
    """Checks every document against the Kubernetes schemas; raises :class:`~tensorfleet.kube.ManifestError`."""
    kube.validate(docs, expected="a Deployment and a Service")


def write(docs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Validates ``docs`` and writes them as one YAML file, atomically."""
    return kube.write(docs, path, check=validate)
