"""Kubernetes manifests for a distributed search: Keras Tuner's oracle and its tuner workers.

Five objects, checked against the Kubernetes schemas (kubernetes-validate) before they are
returned or written:

* a ReadWriteMany PersistentVolumeClaim for the search's directory: the oracle's state, the
  trials' checkpoints (written by the workers, read by the chief to export the best model) and
  the results;
* the chief, a Job of one pod that runs ``python -m tensorfleet.tuning.task`` with
  ``KERASTUNER_TUNER_ID=chief``, listening on every address of its pod; restarted on failure,
  it reloads the oracle's saved state, which is ``--resume`` done by Kubernetes (the workers
  wait for it: Keras Tuner's client waits up to an hour for the oracle);
* a Service ``NAME-oracle`` in front of the chief's port;
* the workers, an Indexed Job of N pods: pod i has ``KERASTUNER_TUNER_ID=tuner<i>`` from its
  completion index, so a worker pod that is restarted asks under the same ID and Keras Tuner
  gives it back the trial it was running;
* every pod gets the search's options as ``TENSORFLEET_TUNE_CONFIG`` (the JSON of
  :class:`~tensorfleet.tuning.config.SearchConfig`); the script path is the one inside the image.

Example:
    >>> docs = tune_manifests(script="/app/tune_digits.py", image="registry.example/tensorfleet:1",
    ...                       workers=4, max_trials=20)
    >>> [(d["kind"], d["metadata"]["name"]) for d in docs]
    [('PersistentVolumeClaim', 'tune-data'), ('Job', 'tune-chief'), ('Service', 'tune-oracle'), ('Job', 'tune-workers')]
    >>> docs[3]["spec"]["completions"], docs[3]["spec"]["completionMode"]
    (4, 'Indexed')
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from tensorfleet import kube, validation
from tensorfleet.tuning.config import SearchConfig, enum_options
from tensorfleet.tuning.task import CONFIG_ENV

__all__ = ["tune_manifests", "validate", "write"]

PORT_NAME = "oracle"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def _container(name: str, image: str, out: str, env: list[dict[str, Any]], cpu: str, memory: str) -> dict[str, Any]:
    return {"name": name, "image": image, "command": ["python", "-m", "tensorfleet.tuning.task", out],
            "env": [*kube.env_list({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}), *env],
            "resources": kube.resources(cpu, memory), "volumeMounts": [{"name": "search", "mountPath": out}]}


def _job(name: str, namespace: str, labels: dict[str, str], container: dict[str, Any], claim: str,
         **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {**spec, "template": {
            "metadata": {"labels": labels},
            "spec": {"restartPolicy": "OnFailure", "containers": [container],
                     "volumes": [{"name": "search", "persistentVolumeClaim": {"claimName": claim}}]}}},
    }


@validation.renamed(out="out_dir")
def tune_manifests(*, script: str, image: str, workers: int, max_trials: int, objective: str = "val_accuracy",
                   direction: str | None = None, algorithm: str = "random", strategy: str = "one_device",
                   devices_per_trial: int = 1, epochs: int = 5, batch_size: int = 32, seed: int = 0,
                   name: str = "tune", namespace: str = "default", port: int = 8000, out_dir: str = "/search",
                   storage: str = "10Gi", storage_class: str | None = None, cpu: str = "1", memory: str = "2Gi",
                   restarts: int = 3) -> list[dict[str, Any]]:
    """The claim, chief Job, oracle Service and worker Job of one search (see the module).

    ``script`` and ``out_dir`` are paths inside the containers (absolute); the other search options
    are those of :func:`tensorfleet.tuning.distributed.search`. ``restarts`` is each Job's
    ``backoffLimit``; ``cpu`` and ``memory`` are each pod's requests and limits.
    """
    for what, path in (("script", script), ("out_dir", out_dir)):
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"{what} must be an absolute path inside the container image. Received: {what}={path!r}")
    kube.image(image)
    kube.dns_label("name", name, max_length=40)  # room for the -workers suffix and pod hashes
    kube.dns_label("namespace", namespace)
    validation.port("port", port)
    validation.integer("restarts", restarts, minimum=0)
    storage, cpu, memory = (kube.quantity(k, v) for k, v in (("storage", storage), ("cpu", cpu), ("memory", memory)))
    config = SearchConfig(script=script, out_dir=out_dir, workers=workers, max_trials=max_trials, objective=objective,
                          **enum_options(direction, algorithm), strategy=strategy,
                          devices_per_trial=devices_per_trial, epochs=epochs, batch_size=batch_size, seed=seed)
    options = {CONFIG_ENV: json.dumps(config.as_dict())}
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "tensorfleet"}
    chief_labels = {**labels, "app.kubernetes.io/component": "oracle"}
    claim_name = f"{name}-data"
    # The chief binds every address of its pod; the workers reach it through the Service.
    chief_env = kube.env_list({**options, "KERASTUNER_TUNER_ID": "chief", "KERASTUNER_ORACLE_IP": "0.0.0.0",
                               "KERASTUNER_ORACLE_PORT": port})
    chief = _container("oracle", image, out_dir, chief_env, cpu, memory)
    chief["ports"] = [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}]
    worker_env: list[dict[str, Any]] = [*kube.env_list(options),
                  {"name": "TUNER_INDEX", "valueFrom": {"fieldRef": {
                      "fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
                  *kube.env_list({"KERASTUNER_TUNER_ID": "tuner$(TUNER_INDEX)",
                                  "KERASTUNER_ORACLE_IP": f"{name}-oracle.{namespace}.svc",
                                  "KERASTUNER_ORACLE_PORT": port})]
    if storage_class:
        kube.dns_subdomain("storage_class", storage_class)
    claim = kube.claim(claim_name, namespace=namespace, labels=labels, size=storage, storage_class=storage_class)
    # The oracle's Service selects the chief's pod by all its labels (the workers share the name).
    service = kube.service(f"{name}-oracle", namespace=namespace, labels=chief_labels, ports={PORT_NAME: port},
                           selector=chief_labels)
    docs = [claim,
            _job(f"{name}-chief", namespace, chief_labels, chief, claim_name, backoffLimit=restarts),
            service,
            _job(f"{name}-workers", namespace, {**labels, "app.kubernetes.io/component": "tuner"},
                 _container("tuner", image, out_dir, worker_env, cpu, memory), claim_name,
                 completions=config.workers, parallelism=config.workers, completionMode="Indexed",
                 backoffLimit=restarts * config.workers)]
    validate(docs)
    return docs


def validate(docs: Sequence[Mapping[str, Any]]) -> None:
    """Checks every document against the Kubernetes schemas; raises :class:`~tensorfleet.kube.ManifestError`."""
    kube.validate(docs, expected="a search's claim, chief Job, oracle Service and worker Job")


def write(docs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Validates ``docs`` and writes them as one YAML file, atomically."""
    return kube.write(docs, path, check=validate)
