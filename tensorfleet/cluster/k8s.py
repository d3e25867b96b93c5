"""Kubernetes manifests for the same job: a Kubeflow ``TFJob`` (``kubeflow.org/v1``).

:func:`tfjob` writes the job the local launcher runs as a TFJob of the Kubeflow training
operator: one replica spec per task type, the operator's restart policy and backoff limit,
container resources, a shared volume for ``BackupAndRestore`` (a ReadWriteMany
``PersistentVolumeClaim`` mounted in every pod, exported as ``TENSORFLEET_BACKUP_DIR``) and the
environment the script needs. As with the launcher, in a parameter-server job only the chief
runs the command; workers and ps run tensorfleet's server (``python -m
tensorfleet.cluster.launcher --serve``).

:func:`validate` checks a manifest before it reaches a cluster: the TFJob against a JSON
schema of the TFJob structure (:data:`TFJOB_SCHEMA`, after the training operator's API
types), every embedded pod template and the claim against the core Kubernetes schemas
(``kubernetes-validate``). :func:`pod_tf_config` computes the TF_CONFIG the operator gives a
pod, the way its controller does (``<job>-<type>-<index>.<namespace>.svc:<port>``; the
evaluator is left out of the cluster), so a test can compare it with what the local
launcher gives the same task.

Example:
    >>> docs = tfjob(name="digits", image="registry.example/train:1", workers=2,
    ...              command=["python", "train.py", "--epochs", "6"])
    >>> [d["kind"] for d in docs]
    ['PersistentVolumeClaim', 'TFJob']
    >>> validate(docs)
"""

from __future__ import annotations

import json
import os
import re
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from tensorfleet.validation import choice

__all__ = [
    "ManifestError",
    "RestartPolicy",
    "TFJOB_SCHEMA",
    "dump_yaml",
    "load_yaml",
    "pod_tf_config",
    "tfjob",
    "validate",
    "write",
]

API_VERSION = "kubeflow.org/v1"
KUBERNETES_VERSION = "1.37.0"
CONTAINER_NAME = "tensorflow"  # the operator looks for this container ...
PORT_NAME = "tfjob-port"  # ... and this port name
DEFAULT_PORT = 2222
BACKUP_MOUNT = "/backup"
SERVE_COMMAND = ["python", "-m", "tensorfleet.cluster.launcher", "--serve"]
REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


class RestartPolicy(str, Enum):
    """The training operator's per-replica restart policies."""

    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"
    EXIT_CODE = "ExitCode"


class ManifestError(ValueError):
    """A manifest that the Kubernetes API server or the training operator would reject."""


_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_QUANTITY = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

_REPLICA_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["replicas", "template"],
    "additionalProperties": False,
    "properties": {
        "replicas": {"type": "integer", "minimum": 0},
        "restartPolicy": {"enum": [p.value for p in RestartPolicy]},
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {"metadata": {"type": "object"}, "spec": {"type": "object", "required": ["containers"]}},
        },
    },
}

#: JSON schema of a TFJob (kubeflow.org/v1), after the training operator's Go API types
#: (TFJobSpec, RunPolicy, ReplicaSpec); pod templates are checked by the core schemas.
TFJOB_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": "TFJob"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "maxLength": 63, "pattern": _DNS_LABEL},
                "namespace": {"type": "string", "maxLength": 63, "pattern": _DNS_LABEL},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["tfReplicaSpecs"],
            "additionalProperties": False,
            "properties": {
                "runPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                        "activeDeadlineSeconds": {"type": "integer", "minimum": 0},
                        "backoffLimit": {"type": "integer", "minimum": 0},
                        "suspend": {"type": "boolean"},
                        "schedulingPolicy": {"type": "object"},
                        "managedBy": {"type": "string"},
                    },
                },
                "successPolicy": {"enum": ["", "AllWorkers"]},
                "enableDynamicWorker": {"type": "boolean"},
                "tfReplicaSpecs": {
                    "type": "object",
                    "minProperties": 1,
                    "propertyNames": {"enum": ["Chief", "Master", "Worker", "PS", "Evaluator"]},
                    "additionalProperties": _REPLICA_SPEC,
                },
            },
        },
        "status": {"type": "object"},
    },
}


# --------------------------------------------------------------------------- writing


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be a {kind} integer. Received: {name}={value!r}")
    return value


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not re.match(_DNS_LABEL, name) or len(name) > 40:
        raise ValueError(
            "name must be a DNS label of at most 40 characters (lower-case letters, digits and '-', "
            f"starting and ending with a letter or digit; pod names add a suffix). Received: name={name!r}"
        )
    return name


def tfjob(
    *,
    name: str,
    image: str,
    command: Sequence[str],
    workers: int,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    namespace: str = "default",
    restart_policy: RestartPolicy | str = RestartPolicy.ON_FAILURE,
    max_restarts: int = 3,
    cpu: str = "1",
    memory: str = "2Gi",
    gpus: int = 0,
    env: Mapping[str, str] | None = None,
    backup_claim: str | None = None,
    backup_size: str = "1Gi",
    storage_class: str | None = None,
    port: int = DEFAULT_PORT,
) -> list[dict[str, Any]]:
    """A TFJob for ``command`` on ``image``, and the claim for its backups.

    Args:
        name: the job's name (a DNS label); pods are ``<name>-<type>-<index>``.
        image: the container image holding the script and tensorfleet.
        command: the trainer's command, e.g. ``["python", "train.py", "--epochs", "6"]``.
        workers: worker replicas (>= 1, or 0 with ``chief=True``).
        ps: parameter-server replicas; a ps job always gets a chief (the coordinator).
        chief: add a Chief replica.
        evaluator: add an Evaluator replica.
        namespace: the Kubernetes namespace.
        restart_policy: the operator's per-replica restart policy.
        max_restarts: the job's ``runPolicy.backoffLimit``.
        cpu: CPU request and limit per pod (a Kubernetes quantity).
        memory: memory request and limit per pod.
        gpus: ``nvidia.com/gpu`` limit per trainer pod.
        env: extra environment for every container.
        backup_claim: an existing ReadWriteMany claim for the backups; by default a claim
            ``<name>-backup`` of ``backup_size`` is written too.
        backup_size: the size of the claim written by default.
        storage_class: the storage class of that claim (the cluster's default if None).
        port: the port every task listens on.

    Returns:
        ``[PersistentVolumeClaim, TFJob]`` (or ``[TFJob]`` with ``backup_claim``), each a dict.

    Example:
        >>> docs = tfjob(name="mnist", image="img:1", workers=2, ps=1, command=["python", "t.py"])
        >>> sorted(docs[-1]["spec"]["tfReplicaSpecs"])
        ['Chief', 'PS', 'Worker']
    """
    _check_name(name)
    if not re.match(_DNS_LABEL, namespace or ""):
        raise ValueError(f"namespace must be a DNS label. Received: namespace={namespace!r}")
    if not isinstance(image, str) or not image.strip():
        raise ValueError(f"image must be a non-empty image reference. Received: image={image!r}")
    if isinstance(command, str) or not command or not all(isinstance(c, str) and c for c in command):
        raise ValueError(f"command must be a non-empty list of strings. Received: command={command!r}")
    _positive_int("workers", workers, minimum=0)
    _positive_int("ps", ps, minimum=0)
    _positive_int("max_restarts", max_restarts, minimum=0)
    _positive_int("gpus", gpus, minimum=0)
    _positive_int("port", port)
    if workers == 0 and not chief:
        raise ValueError("A TFJob needs at least one worker (or a chief). Received: workers=0")
    if ps and not workers:
        raise ValueError(f"A parameter-server job needs at least one worker. Received: workers=0, ps={ps}")
    policy = choice(RestartPolicy, "restart_policy", restart_policy)
    for key, quantity in (("cpu", cpu), ("memory", memory), ("backup_size", backup_size)):
        if not isinstance(quantity, str) or not re.match(_QUANTITY, quantity):
            raise ValueError(f"{key} must be a Kubernetes quantity such as '1', '500m' or '2Gi'. Received: {key}={quantity!r}")
    if ps:
        chief = True
    claim = backup_claim or f"{name}-backup"
    base_env = {"TENSORFLEET_BACKUP_DIR": BACKUP_MOUNT, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    for key in (env or {}):
        if key == "TF_CONFIG":
            raise ValueError("env must not set TF_CONFIG: the training operator gives each pod its own.")
    base_env.update(env or {})

    def replica(task_type: str, count: int) -> dict[str, Any]:
        serves = ps and task_type in ("worker", "ps")
        resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory},
                                     "limits": {"cpu": cpu, "memory": memory}}
        if gpus and not serves and task_type != "ps":
            resources["limits"]["nvidia.com/gpu"] = str(gpus)
        container = {
            "name": CONTAINER_NAME,
            "image": image,
            "command": list(SERVE_COMMAND if serves else command),
            "env": [{"name": k, "value": str(v)} for k, v in base_env.items()],
            "ports": [{"name": PORT_NAME, "containerPort": port}],
            "resources": resources,
            "volumeMounts": [{"name": "backup", "mountPath": BACKUP_MOUNT}],
        }
        return {
            "replicas": count,
            "restartPolicy": policy.value,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tensorfleet"}},
                "spec": {
                    "containers": [container],
                    "volumes": [{"name": "backup", "persistentVolumeClaim": {"claimName": claim}}],
                },
            },
        }

    specs: dict[str, Any] = {}
    for task_type, count in (("chief", int(chief)), ("worker", workers), ("ps", ps), ("evaluator", int(evaluator))):
        if count:
            specs[REPLICA_TYPES[task_type]] = replica(task_type, count)
    job = {
        "apiVersion": API_VERSION,
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tensorfleet"}},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": max_restarts},
            "tfReplicaSpecs": specs,
        },
    }
    docs: list[dict[str, Any]] = []
    if backup_claim is None:
        pvc: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tensorfleet"}},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": backup_size}}},
        }
        if storage_class:
            pvc["spec"]["storageClassName"] = storage_class
        docs.append(pvc)
    docs.append(job)
    return docs


# --------------------------------------------------------------------------- validation


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _validate_core(doc: Mapping[str, Any], where: str) -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(dict(doc), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in getattr(exc, "path", []) or [])
        raise ManifestError(f"{where} is not a valid Kubernetes {doc.get('kind')}: {_first_line(exc)}"
                            + (f" (at {path})" if path else "")) from None


def _validate_tfjob(job: Mapping[str, Any]) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(TFJOB_SCHEMA)
    errors = sorted(validator.iter_errors(job), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        path = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ManifestError(f"TFJob {job.get('metadata', {}).get('name')!r} is invalid at {path}: {error.message}")
    specs = job["spec"]["tfReplicaSpecs"]
    for single in ("Chief", "Master", "Evaluator"):
        if single in specs and specs[single]["replicas"] > 1:
            raise ManifestError(f"A TFJob has at most one {single} replica. Received: replicas={specs[single]['replicas']}")
    if "Chief" in specs and "Master" in specs:
        raise ManifestError("A TFJob has a Chief or a Master, not both.")
    for rtype, spec in specs.items():
        template = spec["template"]
        containers = template["spec"].get("containers") or []
        if not any(c.get("name") == CONTAINER_NAME for c in containers):
            raise ManifestError(
                f"tfReplicaSpecs/{rtype}: the training operator needs a container named {CONTAINER_NAME!r}. "
                f"Received: {[c.get('name') for c in containers]}"
            )
        if "restartPolicy" in template["spec"]:
            raise ManifestError(f"tfReplicaSpecs/{rtype}: set restartPolicy on the replica spec, not in the pod template.")
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{job['metadata']['name']}-{rtype.lower()}"}, "template": template}
        _validate_core(pod_template, f"tfReplicaSpecs/{rtype}/template")


def validate(docs: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> None:
    """Validates a TFJob (and any core resources beside it); raises :class:`ManifestError`.

    Example:
        >>> validate(tfjob(name="x", image="i:1", workers=1, command=["python", "t.py"]))
    """
    items = [docs] if isinstance(docs, Mapping) else list(docs)
    if not items:
        raise ManifestError("The manifest is empty; expected a TFJob.")
    jobs = 0
    for i, doc in enumerate(items):
        if not isinstance(doc, Mapping) or "kind" not in doc:
            raise ManifestError(f"Document {i} is not a Kubernetes object (no 'kind'). Received: {str(doc)[:120]!r}")
        if doc["kind"] == "TFJob":
            jobs += 1
            _validate_tfjob(doc)
        else:
            _validate_core(doc, f"Document {i} ({doc['kind']})")
    if not jobs:
        raise ManifestError(f"The manifest has no TFJob. Received kinds: {[d['kind'] for d in items]}")


# --------------------------------------------------------------------------- TF_CONFIG


def _find_job(docs: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    items = [docs] if isinstance(docs, Mapping) else list(docs)
    for doc in items:
        if isinstance(doc, Mapping) and doc.get("kind") == "TFJob":
            return doc
    raise ManifestError("The manifest has no TFJob.")


def _port_of(spec: Mapping[str, Any]) -> int:
    for container in spec["template"]["spec"].get("containers", []):
        if container.get("name") == CONTAINER_NAME:
            for port in container.get("ports", []) or []:
                if port.get("name") == PORT_NAME:
                    return int(port["containerPort"])
    return DEFAULT_PORT


def pod_tf_config(docs: Mapping[str, Any] | Iterable[Mapping[str, Any]], role: str, index: int,
                  *, cluster_domain: str | None = None) -> dict[str, Any]:
    """The TF_CONFIG the training operator sets in pod ``role``/``index`` of the TFJob.

    Follows the operator's controller: task types lower-cased, addresses
    ``<job>-<type>-<index>.<namespace>.svc[.<domain>]:<port>``, the evaluator left out of the
    cluster, ``"environment": "cloud"``.

    Example:
        >>> job = tfjob(name="mnist", image="i:1", workers=2, command=["python", "t.py"])
        >>> pod_tf_config(job, "worker", 1)["cluster"]["worker"][1]
        'mnist-worker-1.default.svc:2222'
    """
    job = _find_job(docs)
    name = job["metadata"]["name"]
    namespace = job["metadata"].get("namespace", "default")
    domain = cluster_domain if cluster_domain is not None else os.environ.get("CUSTOM_CLUSTER_DOMAIN", "")
    specs = job["spec"]["tfReplicaSpecs"]
    types = {rtype.lower(): rtype for rtype in specs}
    if role not in types:
        raise ValueError(f"The TFJob has no {role!r} replicas. It has: {sorted(types)}")
    count = specs[types[role]]["replicas"]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"index must be in 0..{count - 1} for {role!r}. Received: index={index!r}")
    cluster: dict[str, list[str]] = {}
    for rtype, spec in specs.items():
        if rtype == "Evaluator":
            continue
        port = _port_of(spec)
        rt = rtype.lower()
        suffix = f".{domain}" if domain else ""
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc{suffix}:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"}


# --------------------------------------------------------------------------- YAML


def dump_yaml(docs: Iterable[Mapping[str, Any]]) -> str:
    """The documents as one multi-document YAML string."""
    import yaml

    return yaml.safe_dump_all([json.loads(json.dumps(d)) for d in docs], sort_keys=False, default_flow_style=False)


def load_yaml(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML string."""
    import yaml

    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"The manifest is not valid YAML: {_first_line(exc)}") from None


def write(docs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> None:
    """Validates ``docs`` and writes them as YAML to ``path`` atomically."""
    from tensorfleet.io import write_text

    validate(docs)
    write_text(path, dump_yaml(docs))
