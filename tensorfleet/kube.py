"""Kubernetes manifests: the checks, schema validation and YAML that every manifest writer shares.

A manifest writer (the TFJob of :mod:`tensorfleet.cluster.k8s`, the TFF workers of
:mod:`tensorfleet.federated.backends.k8s`) builds plain dicts, checks its arguments with
:func:`dns_label`, :func:`quantity` and :func:`image`, and hands the documents to
:func:`validate`: every object is checked against the core Kubernetes schemas of
:data:`KUBERNETES_VERSION` (``kubernetes-validate``), and kinds those schemas do not know
(custom resources such as a TFJob) by the validator the writer passes for them.
:func:`write` stores the YAML atomically, so a failed write never leaves half a manifest.

Example:
    >>> claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
    ...          "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    >>> [d["kind"] for d in validate(claim, expected="a claim")]
    ['PersistentVolumeClaim']
    >>> load_yaml(dump_yaml([claim])) == [claim]
    True
    >>> dns_label("name", "Data")
    Traceback (most recent call last):
    ValueError: name must be a DNS label of at most 63 characters (lower-case letters, digits and '-', starting and
    ending with a letter or digit). Received: name='Data'
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

from tensorfleet.io import unique_keys_loader, write_text

__all__ = [
    "DNS_LABEL", "KUBERNETES_VERSION", "ManifestError", "Manifest", "app_labels", "claim", "deployment", "documents",
    "dns_label", "dns_subdomain", "dump_yaml", "env_list", "image", "load_yaml", "quantity", "resources", "service",
    "validate", "validate_object", "write",
]

#: The Kubernetes version whose schemas manifests are checked against.
KUBERNETES_VERSION = "1.37.0"
#: An RFC 1123 label: what names of most Kubernetes objects must be.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_QUANTITY = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

#: One Kubernetes object, or several (a multi-document manifest).
Manifest = Union[Mapping[str, Any], Iterable[Mapping[str, Any]]]


class ManifestError(ValueError):
    """A manifest that the Kubernetes API server (or the operator of a custom kind) would reject."""


# --------------------------------------------------------------------------- argument checks


def dns_label(name: str, value: Any, *, max_length: int = 63) -> str:
    """``value`` if it is a DNS label of at most ``max_length`` characters; else ``ValueError`` naming it.

    Example:
        >>> dns_label("namespace", "ml")
        'ml'
    """
    if not isinstance(value, str) or not re.match(DNS_LABEL, value) or len(value) > max_length:
        raise ValueError(f"{name} must be a DNS label of at most {max_length} characters (lower-case letters, "
                         f"digits and '-', starting and ending with a letter or digit). Received: {name}={value!r}")
    return value


def dns_subdomain(name: str, value: Any) -> str:
    """``value`` if it is a DNS subdomain (dot-separated DNS labels, at most 253 characters), the
    form of names such as a StorageClass's; else ``ValueError`` naming it.

    Example:
        >>> dns_subdomain("storage_class", "nfs.csi.k8s.io")
        'nfs.csi.k8s.io'
    """
    if (not isinstance(value, str) or not value or len(value) > 253
            or not all(re.match(DNS_LABEL, part) and len(part) <= 63 for part in value.split("."))):
        raise ValueError(f"{name} must be a DNS subdomain of at most 253 characters (DNS labels joined by '.': "
                         f"lower-case letters, digits and '-'). Received: {name}={value!r}")
    return value


def quantity(name: str, value: Any) -> str:
    """``value`` if it is a Kubernetes quantity (``"1"``, ``"500m"``, ``"2Gi"``); else ``ValueError``.

    Example:
        >>> quantity("memory", "lots")
        Traceback (most recent call last):
        ValueError: memory must be a Kubernetes quantity such as '1', '500m' or '2Gi'. Received: memory='lots'
    """
    if not isinstance(value, str) or not re.match(_QUANTITY, value):
        raise ValueError(f"{name} must be a Kubernetes quantity such as '1', '500m' or '2Gi'. Received: "
                         f"{name}={value!r}")
    return value


def image(value: Any) -> str:
    """``value`` if it is a container image reference (non-empty, no spaces); else ``ValueError``.

    Example:
        >>> image("my image")
        Traceback (most recent call last):
        ValueError: image must be a container image reference without spaces. Received: image='my image'
    """
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise ValueError(f"image must be a container image reference without spaces. Received: image={value!r}")
    return value


# --------------------------------------------------------------------------- objects


def app_labels(name: str, component: str) -> dict[str, str]:
    """The labels of one app's objects: ``app`` (what its selectors match) and the recommended
    ``app.kubernetes.io`` ones.

    Example:
        >>> app_labels("digits", "model-server")["app"]
        'digits'
    """
    return {"app": name, "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "tensorfleet"}


def resources(cpu: str, memory: str) -> dict[str, dict[str, str]]:
    """A container's requests, with limits equal to them (so its pod is in the Guaranteed QoS class).

    Example:
        >>> resources("500m", "1Gi")
        {'requests': {'cpu': '500m', 'memory': '1Gi'}, 'limits': {'cpu': '500m', 'memory': '1Gi'}}
    """
    amounts = {"cpu": quantity("cpu", cpu), "memory": quantity("memory", memory)}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def env_list(variables: Mapping[str, Any]) -> list[dict[str, str]]:
    """A container's ``env``: ``{"name": ..., "value": ...}`` for each variable, values as strings."""
    return [{"name": key, "value": str(value)} for key, value in variables.items()]


def deployment(name: str, *, namespace: str, labels: Mapping[str, str], replicas: int | None,
               containers: Iterable[Mapping[str, Any]], volumes: Iterable[Mapping[str, Any]] = (),
               grace_seconds: int = 30) -> dict[str, Any]:
    """An ``apps/v1`` Deployment of ``replicas`` pods selected by their ``app`` label.

    Args:
        labels: of the Deployment and its pods; must hold ``app`` (see :func:`app_labels`).
        replicas: None leaves ``spec.replicas`` out, for a Deployment a HorizontalPodAutoscaler
            scales (else every ``kubectl apply`` resets the count the autoscaler chose).
        grace_seconds: the pods' ``terminationGracePeriodSeconds``, the time between SIGTERM and
            SIGKILL that a server has to finish what it is doing.
    """
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": grace_seconds, "containers": [dict(c) for c in containers]}
    if volumes:
        pod["volumes"] = [dict(v) for v in volumes]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            **({} if replicas is None else {"replicas": replicas}),
            "selector": {"matchLabels": {"app": labels["app"]}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def service(name: str, *, namespace: str, labels: Mapping[str, str], ports: Mapping[str, int],
            headless: bool = False, selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ``v1`` Service in front of the pods with ``labels["app"]`` (or those ``selector`` matches),
    one TCP port per ``ports`` item (port name -> number, the container port of the same name as
    its target).

    ``headless`` gives no load balancer (``clusterIP: None``): the name resolves to every ready pod.

    Example:
        >>> service("digits", namespace="ml", labels=app_labels("digits", "model-server"),
        ...         ports={"grpc": 8500})["spec"]["ports"]
        [{'name': 'grpc', 'port': 8500, 'targetPort': 'grpc', 'protocol': 'TCP'}]
    """
    spec: dict[str, Any] = {"clusterIP": "None"} if headless else {}
    spec["selector"] = {"app": labels["app"]} if selector is None else dict(selector)
    spec["ports"] = [{"name": port_name, "port": number, "targetPort": port_name, "protocol": "TCP"}
                     for port_name, number in ports.items()]
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace,
                                                                "labels": dict(labels)}, "spec": spec}


def claim(name: str, *, namespace: str, labels: Mapping[str, str], size: str, storage_class: str | None = None,
          access_mode: str = "ReadWriteMany") -> dict[str, Any]:
    """A ``v1`` PersistentVolumeClaim of ``size`` (the cluster's default storage class unless one is
    named). The caller checks ``size`` and ``storage_class`` under its own argument names
    (:func:`quantity`, :func:`dns_subdomain`).

    Example:
        >>> claim("data", namespace="ml", labels={"app": "x"}, size="1Gi")["spec"]
        {'accessModes': ['ReadWriteMany'], 'resources': {'requests': {'storage': '1Gi'}}}
    """
    spec: dict[str, Any] = {"accessModes": [access_mode], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)}, "spec": spec}


# --------------------------------------------------------------------------- validation


def documents(docs: Manifest) -> list[Mapping[str, Any]]:
    """The objects of a manifest: one object or a sequence of them, as a list."""
    return [docs] if isinstance(docs, Mapping) else list(docs)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def validate_object(doc: Mapping[str, Any], where: str) -> None:
    """Checks one object against the core Kubernetes schemas; raises :class:`ManifestError` that
    starts with ``where`` and ends with the path of the offending field."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(dict(doc), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in getattr(exc, "path", []) or [])
        raise ManifestError(f"{where} is not a valid Kubernetes {doc.get('kind')}: {_first_line(exc)}"
                            + (f" (at {path})" if path else "")) from None
    except kubernetes_validate.SchemaNotFoundError:
        raise ManifestError(f"{where} is not a valid Kubernetes {doc.get('kind')}: Kubernetes {KUBERNETES_VERSION} "
                            f"has no {doc.get('kind')!r} in {doc.get('apiVersion')!r}") from None


def validate(docs: Manifest, *, expected: str,
             kinds: Mapping[str, Callable[[Mapping[str, Any]], None]] | None = None) -> list[Mapping[str, Any]]:
    """Checks every object of a manifest and returns them as a list.

    Args:
        docs: one object or several.
        expected: what the manifest should hold, for the message of an empty one (``"a TFJob"``).
        kinds: validators of kinds the core schemas do not know (custom resources), by kind.

    Raises:
        ManifestError: an empty manifest, an object without ``kind``, or an invalid object.
    """
    items = documents(docs)
    if not items:
        raise ManifestError(f"The manifest is empty; expected {expected}.")
    for i, doc in enumerate(items):
        if not isinstance(doc, Mapping) or "kind" not in doc:
            raise ManifestError(f"Document {i} is not a Kubernetes object (no 'kind'). Received: {str(doc)[:120]!r}")
        custom = (kinds or {}).get(doc["kind"])
        if custom is not None:
            custom(doc)
        else:
            validate_object(doc, f"Document {i} ({doc['kind']})")
    return items


# --------------------------------------------------------------------------- YAML


def dump_yaml(docs: Iterable[Mapping[str, Any]]) -> str:
    """The documents as one multi-document YAML string."""
    import yaml

    return yaml.safe_dump_all([json.loads(json.dumps(d)) for d in docs], sort_keys=False, default_flow_style=False)


def load_yaml(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML string; a key given twice in one mapping is refused."""
    import yaml

    try:
        return [d for d in yaml.load_all(text, Loader=unique_keys_loader()) if d is not None]  # noqa: S506 (safe)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or _first_line(exc)
        raise ManifestError(f"The manifest is not valid YAML: {problem}{where}") from None


def write(docs: Iterable[Mapping[str, Any]], path: str | os.PathLike[str], *,
          check: Callable[[Any], Any]) -> Path:
    """Checks ``docs`` with ``check`` (the writer's ``validate``), then writes them as one YAML file,
    atomically."""
    docs = list(docs)
    check(docs)
    return write_text(path, dump_yaml(docs))
