"""The serving manifests: a Deployment running ``tensorfleet serve``, its Service and autoscaler,
checked by the real Kubernetes schemas, with the flags and probe paths the server really has."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from tensorfleet import kube
from tensorfleet.serving import k8s


def _container(docs) -> dict:
    return docs[0]["spec"]["template"]["spec"]["containers"][0]


def test_manifests_validate_and_round_trip_through_yaml(tmp_path: Path) -> None:
    docs = k8s.serving_manifests(name="digits", image="registry.example/digits:1",
                                 scaling=k8s.PodScaling(min_replicas=2, max_replicas=6),
                                 model=k8s.ServedModel(claim="models"))
    assert [(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("apps/v1", "Deployment", "digits"), ("v1", "Service", "digits"),
        ("autoscaling/v2", "HorizontalPodAutoscaler", "digits")]
    path = k8s.write(docs, tmp_path / "serving.yaml")
    loaded = kube.load_yaml(path.read_text())
    assert loaded == docs
    k8s.validate(loaded)  # the real kubernetes-validate schemas, no mocks


def test_container_runs_serve_on_tf_serving_ports_with_probes_on_the_rest_port() -> None:
    docs = k8s.serving_manifests(name="digits", image="img:1", scaling=k8s.PodScaling(replicas=3),
                                 server=k8s.ServerFlags(args=("--enable-batching", "--max-batch-size", "32")))
    assert docs[0]["spec"]["replicas"] == 3
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    container = _container(docs)
    assert container["command"] == [
        "tensorfleet", "serve", "/models/digits", "--model-name", "digits", "--host", "0.0.0.0", "--port", "8500",
        "--rest-api-port", "8501", "--enable-batching", "--max-batch-size", "32"]
    assert container["ports"] == [{"name": "grpc", "containerPort": 8500, "protocol": "TCP"},
                                  {"name": "rest", "containerPort": 8501, "protocol": "TCP"}]
    probe = {"port": "rest"}
    assert container["readinessProbe"] == {"httpGet": {"path": "/readyz", **probe}, "periodSeconds": 5,
                                           "timeoutSeconds": 5, "failureThreshold": 3}
    assert container["livenessProbe"] == {"httpGet": {"path": "/healthz", **probe}, "periodSeconds": 10,
                                          "timeoutSeconds": 5, "failureThreshold": 3}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", **probe}
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"},
                                      "limits": {"cpu": "1", "memory": "2Gi"}}
    assert "volumeMounts" not in container
    assert docs[1]["spec"]["ports"] == [
        {"name": "grpc", "port": 8500, "targetPort": "grpc", "protocol": "TCP"},
        {"name": "rest", "port": 8501, "targetPort": "rest", "protocol": "TCP"}]
    assert docs[1]["spec"]["selector"] == docs[0]["spec"]["selector"]["matchLabels"] == {"app": "digits"}


def test_the_command_parses_with_the_real_serve_cli_and_the_probes_hit_real_routes() -> None:
    from tensorfleet.cli.serve import serve_command
    from tensorfleet.serving.rest import ROUTES

    command = _container(k8s.serving_manifests(
        name="digits", image="img:1", model=k8s.ServedModel(base_path="/srv/m", name="mnist"),
        server=k8s.ServerFlags(grpc_port=9000, rest_port=9001)))["command"]
    app = typer.Typer()
    app.command("serve")(serve_command)
    params = typer.main.get_command(app).make_context("serve", command[2:]).params
    assert (str(params["base"]), params["model_name"], params["host"], params["port"], params["rest_api_port"]) == (
        "/srv/m", "mnist", "0.0.0.0", 9000, 9001)
    assert {"/healthz", "/readyz"} <= set(ROUTES)


def test_autoscaler_bounds_and_cpu_target_and_the_deployment_leaves_the_count_to_it() -> None:
    docs = k8s.serving_manifests(name="digits", image="img:1",
                                 scaling=k8s.PodScaling(min_replicas=2, max_replicas=6, target_cpu=65))
    assert docs[2]["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits"},
        "minReplicas": 2, "maxReplicas": 6,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                                                      "target": {"type": "Utilization", "averageUtilization": 65}}}]}
    # No spec.replicas: applying the manifest again must not reset the count the autoscaler chose.
    assert "replicas" not in docs[0]["spec"]
    # The CPU target is a share of the request, so the pods must request CPU.
    assert _container(docs)["resources"]["requests"]["cpu"] == "1"
    assert k8s.serving_manifests(name="digits", image="img:1")[0]["spec"]["replicas"] == 1


def test_a_model_claim_is_mounted_read_only_at_the_base_path() -> None:
    docs = k8s.serving_manifests(name="digits", image="img:1",
                                 model=k8s.ServedModel(base_path="/models/digits", claim="trained-models"))
    assert _container(docs)["volumeMounts"] == [{"name": "models", "mountPath": "/models/digits", "readOnly": True}]
    assert docs[0]["spec"]["template"]["spec"]["volumes"] == [
        {"name": "models", "persistentVolumeClaim": {"claimName": "trained-models", "readOnly": True}}]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: k8s.serving_manifests(name="Digits", image="img:1"),
     "name must be a DNS label of at most 63 characters (lower-case letters, digits and '-', "
     "starting and ending with a letter or digit). Received: name='Digits'"),
    (lambda: k8s.PodScaling(replicas=0), "replicas must be a positive integer. Received: replicas=0"),
    (lambda: k8s.PodScaling(min_replicas=0, max_replicas=2),
     "min_replicas must be a positive integer. Received: min_replicas=0"),
    (lambda: k8s.PodScaling(min_replicas=4, max_replicas=2),
     "min_replicas must not exceed max_replicas. Received: min_replicas=4, max_replicas=2"),
    (lambda: k8s.PodScaling(max_replicas=2), "min_replicas and max_replicas go together (they make the "
                                              "HorizontalPodAutoscaler). Received: min_replicas=None, max_replicas=2"),
    (lambda: k8s.PodScaling(replicas=2, min_replicas=2, max_replicas=6),
     "Give replicas or min_replicas/max_replicas, not both: with an autoscaler the Deployment has no replica count "
     "of its own (so that applying the manifest again does not reset the autoscaler's). Received: replicas=2, "
     "min_replicas=2, max_replicas=6"),
    (lambda: k8s.PodScaling(min_replicas=1, max_replicas=2, target_cpu=0),
     "target_cpu must be a positive integer. Received: target_cpu=0"),
    (lambda: k8s.ServerFlags(rest_port=8500),
     "grpc_port and rest_port must differ. Received: grpc_port=8500, rest_port=8500"),
    (lambda: k8s.ServedModel(base_path="models/digits"),
     "base_path must be an absolute path in the pod. Received: base_path='models/digits'"),
    (lambda: k8s.ServedModel(name="a/b"),
     "The model's name must be a non-empty name without '/' or spaces. Received: name='a/b'"),
    (lambda: k8s.ServerFlags(args=("--host=127.0.0.1",)),
     "args must not set --host: the manifest sets it (the model's name with ServedModel(name=...), the ports with "
     "grpc_port and rest_port). Received: '--host=127.0.0.1'"),
    (lambda: k8s.PodResources(cpu="lots"),
     "cpu must be a Kubernetes quantity such as '1', '500m' or '2Gi'. Received: cpu='lots'"),
])
def test_bad_arguments_are_one_clear_error(make, message) -> None:
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


def test_a_group_that_is_not_its_option_class_is_named() -> None:
    with pytest.raises(TypeError) as info:
        k8s.serving_manifests(name="digits", image="img:1", scaling=3)
    assert str(info.value) == "scaling must be a PodScaling, such as scaling=PodScaling(). Received: scaling=3"
