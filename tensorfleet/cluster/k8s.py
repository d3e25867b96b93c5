"""Kubernetes manifests for the same job: a Kubeflow ``TFJob`` (``kubeflow.org/v1``).

:func:`tfjob` writes the job the local launcher runs as a TFJob of the Kubeflow training
operator: one replica spec per task type, the operator's restart policy and backoff limit,
container resources, a shared volume for ``BackupAndRestore`` (a ReadWriteMany
``PersistentVolumeClaim`` of a storage class the user may name, mounted in every pod that runs
the script and exported there as ``TENSORFLEET_BACKUP_DIR``; the servers of a parameter-server
job never write backups and get no mount) and the environment the script needs. As with the
launcher, in a parameter-server job only the chief runs the command; workers and ps run
tensorfleet's server (``python -P -m tensorfleet.cluster.launcher --serve``).

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

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Sequence

from tensorfleet import kube, validation
from tensorfleet.cluster.contract import ENV_BACKUP_DIR, SERVE_ARGS, check_mesh_tasks, check_task_counts
from tensorfleet.validation import choice, integer

__all__ = ["RestartPolicy", "TFJOB_SCHEMA", "pod_tf_config", "tfjob", "validate", "write"]

API_VERSION = "kubeflow.org/v1"
CONTAINER_NAME = "tensorflow"  # the operator looks for this container ...
PORT_NAME = "tfjob-port"  # ... and this port name
DEFAULT_PORT = 2222
BACKUP_MOUNT = "/backup"
SERVE_COMMAND = ["python", *SERVE_ARGS]
REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


class RestartPolicy(str, Enum):
    """The training operator's per-replica restart policies."""

    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"
    EXIT_CODE = "ExitCode"


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
                "name": {"type": "string", "maxLength": 63, "pattern": kube.DNS_LABEL},
                "namespace": {"type": "string", "maxLength": 63, "pattern": kube.DNS_LABEL},
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
    mesh: bool = False,
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
        storage_class: the storage class of that claim (the cluster's default if None); it
            must offer ReadWriteMany volumes (e.g. NFS or CephFS).
        port: the port every task listens on.
        mesh: the workers are the processes of one DTensor mesh (``tensorfleet launch --mesh`` on a
            cluster): every worker gets ``TENSORFLEET_MESH_ACROSS_PROCESSES=1``, and a ``Mesh`` made in
            the script takes the workers of the pod's TF_CONFIG as DTensor's clients. Workers only.

    Returns:
        ``[PersistentVolumeClaim, TFJob]`` (or ``[TFJob]`` with ``backup_claim``), each a dict.

    Example:
        >>> docs = tfjob(name="mnist", image="img:1", workers=2, ps=1, command=["python", "t.py"])
        >>> sorted(docs[-1]["spec"]["tfReplicaSpecs"])
        ['Chief', 'PS', 'Worker']
    """
    kube.dns_label("name", name, max_length=40)  # pod names add "-<type>-<index>" to it
    kube.dns_label("namespace", namespace)
    if mesh:
        check_mesh_tasks({"ps": ps, "chief": int(chief), "evaluator": int(evaluator)}, env)
        env = _mesh_env(env)
    chief = check_task_counts(workers, ps, chief, job="A TFJob")
    integer("max_restarts", max_restarts, minimum=0)
    policy = choice(RestartPolicy, "restart_policy", restart_policy)
    kube.quantity("backup_size", backup_size)
    if storage_class is not None:
        kube.dns_subdomain("storage_class", storage_class)
        if backup_claim is not None:
            raise ValueError(f"storage_class applies to the claim tensorfleet writes, not to an existing one. "
                             f"Received: "
                             f"storage_class={storage_class!r} with backup_claim={backup_claim!r}; drop one of them.")
    pod = _Pod(image=kube.image(image), command=_check_command(command), cpu=kube.quantity("cpu", cpu),
               memory=kube.quantity("memory", memory), gpus=integer("gpus", gpus, minimum=0),
               env=_container_env(env), port=validation.port("port", port), claim=backup_claim or f"{name}-backup",
               labels={"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tensorfleet"})
    counts = (("chief", int(chief)), ("worker", workers), ("ps", ps), ("evaluator", int(evaluator)))
    specs = {REPLICA_TYPES[task_type]: _replica_spec(pod, task_type, count, policy, serves=bool(ps))
             for task_type, count in counts if count}
    job = {
        "apiVersion": API_VERSION,
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(pod.labels)},
        "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": max_restarts}, "tfReplicaSpecs": specs},
    }
    if backup_claim is not None:
        return [job]
    return [kube.claim(pod.claim, namespace=namespace, labels=pod.labels, size=backup_size,
                       storage_class=storage_class), job]


@dataclass(frozen=True)
class _Pod:
    """What every pod of the job shares."""

    image: str
    command: list[str]
    cpu: str
    memory: str
    gpus: int
    env: dict[str, str]
    port: int
    claim: str
    labels: dict[str, str]


def _check_command(command: Any) -> list[str]:
    if isinstance(command, str) or not command or not all(isinstance(c, str) and c for c in command):
        raise ValueError(f"command must be a non-empty list of strings. Received: command={command!r}")
    return list(command)


def _container_env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env and "TF_CONFIG" in env:
        raise ValueError("env must not set TF_CONFIG: the training operator gives each pod its own.")
    return {ENV_BACKUP_DIR: BACKUP_MOUNT, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}


def _mesh_env(env: Mapping[str, str] | None) -> dict[str, str]:
    from tensorfleet.model_parallel.mesh.clients import ENV_ACROSS

    given = dict(env or {})
    if given.get(ENV_ACROSS, "1") != "1":
        raise ValueError(f"mesh=True (--mesh) sets {ENV_ACROSS}=1 in every worker; env must not set it otherwise. "
                         f"Received: {ENV_ACROSS}={given[ENV_ACROSS]!r}")
    return {**given, ENV_ACROSS: "1"}


def _servers_env(env: Mapping[str, str]) -> dict[str, str]:
    """A server's environment: no backup directory, which only the tasks running the script use."""
    return {k: v for k, v in env.items() if k != ENV_BACKUP_DIR}


def _replica_spec(pod: _Pod, task_type: str, count: int, policy: RestartPolicy, *, serves: bool) -> dict[str, Any]:
    # In a parameter-server job, workers and ps only serve; only the chief runs the command.
    server = serves and task_type in ("worker", "ps")
    resources: dict[str, Any] = kube.resources(pod.cpu, pod.memory)
    if pod.gpus and not server and task_type != "ps":
        resources["limits"]["nvidia.com/gpu"] = str(pod.gpus)
    env = _servers_env(pod.env) if server else pod.env
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": pod.image,
        "command": list(SERVE_COMMAND if server else pod.command),
        "env": kube.env_list(env),
        "ports": [{"name": PORT_NAME, "containerPort": pod.port}],
        "resources": resources,
    }
    spec: dict[str, Any] = {"containers": [container]}
    if not server:  # the backups are written by the tasks that run the script (the chief, in a ps job)
        container["volumeMounts"] = [{"name": "backup", "mountPath": BACKUP_MOUNT}]
        spec["volumes"] = [{"name": "backup", "persistentVolumeClaim": {"claimName": pod.claim}}]
    return {
        "replicas": count,
        "restartPolicy": policy.value,
        "template": {"metadata": {"labels": dict(pod.labels)}, "spec": spec},
    }


# --------------------------------------------------------------------------- validation


def _validate_tfjob(job: Mapping[str, Any]) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(TFJOB_SCHEMA)
    errors = sorted(validator.iter_errors(job), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        path = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise kube.ManifestError(f"TFJob {job.get('metadata', {}).get('name')!r} is invalid at {path}: {error.message}")
    specs = job["spec"]["tfReplicaSpecs"]
    for single in ("Chief", "Master", "Evaluator"):
        if single in specs and specs[single]["replicas"] > 1:
            raise kube.ManifestError(f"A TFJob has at most one {single} replica. "
                                     f"Received: replicas={specs[single]['replicas']}")
    if "Chief" in specs and "Master" in specs:
        raise kube.ManifestError("A TFJob has a Chief or a Master, not both.")
    for rtype, spec in specs.items():
        template = spec["template"]
        containers = template["spec"].get("containers") or []
        if not any(c.get("name") == CONTAINER_NAME for c in containers):
            raise kube.ManifestError(
                f"tfReplicaSpecs/{rtype}: the training operator needs a container named {CONTAINER_NAME!r}. "
                f"Received: {[c.get('name') for c in containers]}"
            )
        if "restartPolicy" in template["spec"]:
            raise kube.ManifestError(f"tfReplicaSpecs/{rtype}: set restartPolicy on the replica spec, not in the pod "
                                     "template.")
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{job['metadata']['name']}-{rtype.lower()}"}, "template": template}
        kube.validate_object(pod_template, f"tfReplicaSpecs/{rtype}/template")


def validate(docs: kube.Manifest) -> None:
    """Validates a TFJob (and any core resources beside it); raises :class:`~tensorfleet.kube.ManifestError`.

    Example:
        >>> validate(tfjob(name="x", image="i:1", workers=1, command=["python", "t.py"]))
    """
    items = kube.validate(docs, expected="a TFJob", kinds={"TFJob": _validate_tfjob})
    if not any(doc["kind"] == "TFJob" for doc in items):
        raise kube.ManifestError(f"The manifest has no TFJob. Received kinds: {[d['kind'] for d in items]}")


# --------------------------------------------------------------------------- TF_CONFIG


def _find_job(docs: kube.Manifest) -> Mapping[str, Any]:
    for doc in kube.documents(docs):
        if isinstance(doc, Mapping) and doc.get("kind") == "TFJob":
            return doc
    raise kube.ManifestError("The manifest has no TFJob.")


def _port_of(spec: Mapping[str, Any]) -> int:
    for container in spec["template"]["spec"].get("containers", []):
        if container.get("name") == CONTAINER_NAME:
            for port in container.get("ports", []) or []:
                if port.get("name") == PORT_NAME:
                    return int(port["containerPort"])
    return DEFAULT_PORT


def pod_tf_config(docs: kube.Manifest, role: str, index: int,
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
    integer("index", index, minimum=0, maximum=specs[types[role]]["replicas"] - 1)
    cluster: dict[str, list[str]] = {}
    for rtype, spec in specs.items():
        if rtype == "Evaluator":
            continue
        port = _port_of(spec)
        rt = rtype.lower()
        suffix = f".{domain}" if domain else ""
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc{suffix}:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"}


# --------------------------------------------------------------------------- writing files


def write(docs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Validates ``docs`` and writes them as YAML to ``path`` atomically.

    Example:
        >>> write(tfjob(name="x", image="i:1", workers=1, command=["python", "t.py"]), "x.yaml").name
        'x.yaml'
    """
    return kube.write(docs, path, check=validate)
