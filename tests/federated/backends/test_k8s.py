"""Kubernetes manifests for TFF workers: Deployment + headless Service, checked against the schemas."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tensorfleet import kube
from tensorfleet.federated.backends import k8s


def test_manifest_for_four_workers_is_a_valid_deployment_and_headless_service() -> None:
    deployment, service = k8s.federated_workers(replicas=4, image="registry.example/tensorfleet:1", port=8471,
                                                max_concurrent=2)
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert deployment["spec"]["replicas"] == 4
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/tensorfleet:1"
    assert container["command"] == ["tensorfleet", "federated", "worker", "--port", "8471", "--host", "0.0.0.0",
                                    "--runtime", "tff", "--max-concurrent", "2"]
    assert container["ports"] == [{"name": "tff-worker", "containerPort": 8471, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "tff-worker"}
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert service["spec"]["clusterIP"] == "None"  # headless: DNS lists every ready pod
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == {"app": "tff-workers"}
    assert deployment["spec"]["template"]["metadata"]["labels"]["app"] == "tff-workers"
    k8s.validate([deployment, service])  # the real Kubernetes schemas


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d[0]["spec"].__setitem__("replicas", "three"),
     "Document 0 (Deployment) is not a valid Kubernetes Deployment: 'three' is not of type 'integer', 'null' "
     "(at spec/replicas)"),
    (lambda d: d[0]["spec"]["template"]["spec"]["containers"][0].__setitem__("imagePolicy", "x"),
     "Document 0 (Deployment) is not a valid Kubernetes Deployment: Additional properties are not allowed "
     "('imagePolicy' was unexpected) (at spec/template/spec/containers/0)"),
    (lambda d: d[1]["spec"].__setitem__("ports", [{"port": "eighty"}]),
     "Document 1 (Service) is not a valid Kubernetes Service: 'eighty' is not of type 'integer' "
     "(at spec/ports/0/port)"),
])
def test_schema_violations_are_reported_with_the_path(mutate: Any, message: str) -> None:
    docs = copy.deepcopy(k8s.federated_workers(replicas=2, image="tensorfleet:1"))
    mutate(docs)
    with pytest.raises(kube.ManifestError) as info:
        k8s.validate(docs)
    assert str(info.value) == message


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 0}, "replicas must be a positive integer. Received: replicas=0"),
    ({"image": "my image"}, "image must be a container image reference without spaces. Received: image='my image'"),
    ({"name": "TFF_Workers"}, "name must be a DNS label of at most 63 characters (lower-case letters, digits and '-', "
                              "starting and ending with a letter or digit). Received: name='TFF_Workers'"),
    ({"port": 0}, "port must be an integer from 1 to 65535. Received: port=0"),
])
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    args = {"replicas": 2, "image": "tensorfleet:1", **kwargs}
    with pytest.raises(ValueError) as info:
        k8s.federated_workers(**args)
    assert str(info.value) == message


def test_cli_writes_the_manifest_and_it_reads_back_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorfleet.cli.main import main
    out = tmp_path / "workers.yaml"
    assert main(["k8s", "federated-workers", "--replicas", "3", "--image", "reg.example/tf:2", "--output",
                 str(out)]) == 0
    assert "3 workers on port 8000" in capsys.readouterr().err
    docs = kube.load_yaml(out.read_text())
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    assert docs[0]["spec"]["replicas"] == 3
    k8s.validate(docs)
    assert main(["k8s", "federated-workers", "--replicas", "0", "--image", "x"]) == 2
    assert capsys.readouterr().err.strip() == "error: replicas must be a positive integer. Received: replicas=0"


def test_worker_addresses_lists_every_address_of_the_name() -> None:
    assert k8s.worker_addresses("localhost", domain="", port=8471) in (["127.0.0.1:8471"],
                                                                        ["127.0.0.1:8471", "[::1]:8471"])
    with pytest.raises(ValueError, match="The worker Service's name does not resolve"):
        k8s.worker_addresses("no-such-service", namespace="nowhere", domain="invalid")


def test_tensorflow_workers_run_the_current_tracks_worker_behind_a_headless_service() -> None:
    deployment, service = k8s.federated_workers(replicas=2, image="registry.example/tensorfleet:1", port=8471,
                                                runtime="tensorflow")
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "tf-workers"
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "tf-worker"
    assert container["command"] == ["tensorfleet", "federated", "worker", "--port", "8471", "--host", "0.0.0.0",
                                    "--runtime", "tensorflow"]
    assert container["ports"] == [{"name": "tf-worker", "containerPort": 8471, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == container["livenessProbe"]["tcpSocket"] == {"port": "tf-worker"}
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "tf-worker", "port": 8471, "targetPort": "tf-worker",
                                         "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == {"app": "tf-workers"}
    assert deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "tf-worker"
    k8s.validate([deployment, service])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"runtime": "tensorflow", "max_concurrent": 4},
     "max_concurrent (--max-concurrent) applies to TFF's workers (runtime='tff'), not to TensorFlow servers. "
     "Received: max_concurrent=4 with runtime='tensorflow'"),
    ({"runtime": "tf"}, "runtime must be one of 'tensorflow', 'tff'. Received: runtime='tf'"),
])
def test_what_does_not_apply_to_the_runtime_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        k8s.federated_workers(replicas=2, image="tensorfleet:1", **kwargs)
    assert str(info.value) == message


def test_cli_writes_tensorflow_workers(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorfleet.cli.main import main
    assert main(["k8s", "federated-workers", "--replicas", "2", "--image", "reg.example/tf:2", "--runtime",
                 "tensorflow", "--name", "fed"]) == 0
    deployment, service = kube.load_yaml(capsys.readouterr().out)
    assert service["metadata"]["name"] == "fed"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--runtime", "tensorflow"]
    assert main(["k8s", "federated-workers", "--replicas", "2", "--image", "x:1", "--runtime", "tensorflow",
                 "--max-concurrent", "2"]) == 2
    assert "applies to TFF's workers" in capsys.readouterr().err
