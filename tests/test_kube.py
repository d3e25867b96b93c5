"""The shared Kubernetes helper: argument checks, validation of every object (custom kinds by their
own validator), YAML round trip and the atomic write that leaves nothing behind when invalid."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorfleet import kube

CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


def test_custom_kinds_go_to_their_validator_and_core_kinds_to_the_schemas() -> None:
    seen = []
    custom = {"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert kube.validate([CLAIM, custom], expected="a Widget", kinds={"Widget": seen.append}) == [CLAIM, custom]
    assert seen == [custom]
    with pytest.raises(kube.ManifestError) as info:
        kube.validate([CLAIM, custom], expected="a Widget")
    assert str(info.value) == ("Document 1 (Widget) is not a valid Kubernetes Widget: Kubernetes 1.37.0 has no "
                               "'Widget' in 'example.org/v1'")


@pytest.mark.parametrize(("docs", "message"), [
    ([], "The manifest is empty; expected a claim."),
    ([CLAIM, "text"], "Document 1 is not a Kubernetes object (no 'kind'). Received: 'text'"),
    ({**CLAIM, "spec": {**CLAIM["spec"], "accessModes": "ReadWriteOnce"}},
     "Document 0 (PersistentVolumeClaim) is not a valid Kubernetes PersistentVolumeClaim: 'ReadWriteOnce' is not of "
     "type 'array', 'null' (at spec/accessModes)"),
])
def test_invalid_manifests_are_one_clear_error(docs, message) -> None:
    with pytest.raises(kube.ManifestError) as info:
        kube.validate(docs, expected="a claim")
    assert str(info.value) == message


def test_write_checks_first_and_leaves_nothing_behind_when_invalid(tmp_path: Path) -> None:
    path = kube.write([CLAIM], tmp_path / "claim.yaml", check=lambda d: kube.validate(d, expected="a claim"))
    assert kube.load_yaml(path.read_text()) == [CLAIM]

    def refuse(docs) -> None:
        raise kube.ManifestError("no")

    with pytest.raises(kube.ManifestError, match="^no$"):
        kube.write([CLAIM], tmp_path / "other.yaml", check=refuse)
    assert [p.name for p in tmp_path.iterdir()] == ["claim.yaml"]


def test_invalid_yaml_is_a_manifest_error() -> None:
    with pytest.raises(kube.ManifestError, match=r"^The manifest is not valid YAML: "):
        kube.load_yaml("kind: [unclosed")


def test_a_key_given_twice_is_refused_with_its_lines() -> None:
    # PyYAML keeps the last value silently; a manifest read back (or written by hand) says which key is doubled.
    text = "kind: Pod\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  name: b\n"
    with pytest.raises(kube.ManifestError) as caught:
        kube.load_yaml(text)
    assert str(caught.value) == ("The manifest is not valid YAML: the key 'name' is given twice (first at line 6) "
                                 "(line 7, column 3)")
    assert kube.load_yaml("a: 1\n---\na: 2\n") == [{"a": 1}, {"a": 2}]  # one key per document is no repeat
    with pytest.raises(kube.ManifestError, match=r"^The manifest is not valid YAML: the key 'backoffLimit' is given "
                                                 r"twice \(first at line 1\) \(line 1, column 55\)$"):
        kube.load_yaml("runPolicy: {cleanPodPolicy: Running, backoffLimit: 3, backoffLimit: 7}\n")  # on one line


def test_merge_keys_are_yaml_and_their_keys_may_be_overridden() -> None:
    text = "base: &labels {app: a, tier: web}\nmetadata: {<<: *labels, tier: db}\n"
    assert kube.load_yaml(text) == [{"base": {"app": "a", "tier": "web"}, "metadata": {"app": "a", "tier": "db"}}]


@pytest.mark.parametrize(("check", "value", "message"), [
    (lambda v: kube.dns_label("name", v, max_length=5), "abcdef",
     "name must be a DNS label of at most 5 characters (lower-case letters, digits and '-', starting and ending "
     "with a letter or digit). Received: name='abcdef'"),
    (lambda v: kube.dns_label("name", v), "-a", "name must be a DNS label of at most 63 characters"),
    (lambda v: kube.quantity("cpu", v), 2, "cpu must be a Kubernetes quantity such as '1', '500m' or '2Gi'. "
                                           "Received: cpu=2"),
    (kube.image, " ", "image must be a container image reference without spaces. Received: image=' '"),
    (lambda v: kube.dns_subdomain("storage_class", v), "nfs..io",
     "storage_class must be a DNS subdomain of at most 253 characters (DNS labels joined by '.': lower-case "
     "letters, digits and '-'). Received: storage_class='nfs..io'"),
    (lambda v: kube.dns_subdomain("storage_class", v), "a" * 64, "storage_class must be a DNS subdomain"),
])
def test_argument_checks_name_the_value(check, value, message) -> None:
    with pytest.raises(ValueError) as info:
        check(value)
    assert str(info.value).startswith(message)


def test_argument_checks_return_good_values() -> None:
    assert (kube.dns_label("name", "a-1"), kube.quantity("memory", "500Mi"), kube.image("reg.example/x:1"),
            kube.dns_subdomain("storage_class", "nfs.csi.k8s.io")) == ("a-1", "500Mi", "reg.example/x:1",
                                                                       "nfs.csi.k8s.io")


def test_deployment_and_service_build_valid_objects_selected_by_the_app_label() -> None:
    labels = kube.app_labels("web", "model-server")
    assert labels == {"app": "web", "app.kubernetes.io/component": "model-server",
                      "app.kubernetes.io/part-of": "tensorfleet"}
    container = {"name": "web", "image": "img:1", "env": kube.env_list({"A": 1, "B": "x"}),
                 "resources": kube.resources("500m", "1Gi")}
    deployment = kube.deployment("web", namespace="ml", labels=labels, replicas=2, containers=[container],
                                 grace_seconds=20)
    service = kube.service("web", namespace="ml", labels=labels, ports={"grpc": 8500, "rest": 8501})
    headless = kube.service("web", namespace="ml", labels=labels, ports={"grpc": 8500}, headless=True)
    assert kube.validate([deployment, service, headless], expected="a Deployment") == [deployment, service, headless]
    assert deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    assert deployment["spec"]["template"]["spec"] == {"terminationGracePeriodSeconds": 20, "containers": [container]}
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "x"}]
    assert service["spec"] == {"selector": {"app": "web"}, "ports": [
        {"name": "grpc", "port": 8500, "targetPort": "grpc", "protocol": "TCP"},
        {"name": "rest", "port": 8501, "targetPort": "rest", "protocol": "TCP"}]}
    assert headless["spec"]["clusterIP"] == "None"
    scaled = kube.deployment("web", namespace="ml", labels=labels, replicas=None, containers=[container])
    assert list(scaled["spec"]) == ["selector", "template"]
    kube.validate(scaled, expected="a Deployment")


def test_the_helpers_rebuild_the_federated_workers_exactly() -> None:
    # The TFF workers' Deployment and headless Service are these helpers' objects, so that writer can use them.
    from tensorfleet.federated.backends.k8s import PORT_NAME, federated_workers

    deployment, service = federated_workers(replicas=3, image="img:1", cpu="2", memory="4Gi")
    labels = kube.app_labels("tff-workers", "tff-worker")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == kube.resources("2", "4Gi")
    assert kube.deployment("tff-workers", namespace="default", labels=labels, replicas=3,
                           containers=[container]) == deployment
    assert kube.service("tff-workers", namespace="default", labels=labels, ports={PORT_NAME: 8000},
                        headless=True) == service


def test_resources_check_their_quantities() -> None:
    with pytest.raises(ValueError) as info:
        kube.resources("1", "2 GB")
    assert str(info.value) == ("memory must be a Kubernetes quantity such as '1', '500m' or '2Gi'. Received: memory='2 "
                               "GB'")


def test_claim_builds_a_valid_claim_with_or_without_a_storage_class() -> None:
    plain = kube.claim("data", namespace="ml", labels={"app": "x"}, size="1Gi")
    assert plain == {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "data", "namespace": "ml", "labels": {"app": "x"}},
                     "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    named = kube.claim("data", namespace="ml", labels={"app": "x"}, size="5Gi", storage_class="nfs.csi.k8s.io",
                       access_mode="ReadWriteOnce")
    assert named["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}},
                             "storageClassName": "nfs.csi.k8s.io"}
    assert kube.validate([plain, named], expected="claims") == [plain, named]


def test_a_service_can_select_its_pods_by_labels_other_than_app() -> None:
    # The tuning oracle's Service selects the chief's pod by all its labels: its workers share the name.
    labels = {"app.kubernetes.io/name": "tune", "app.kubernetes.io/component": "oracle"}
    service = kube.service("tune-oracle", namespace="ml", labels=labels, ports={"oracle": 8000}, selector=labels)
    assert service["spec"] == {"selector": labels,
                               "ports": [{"name": "oracle", "port": 8000, "targetPort": "oracle", "protocol": "TCP"}]}
    kube.validate(service, expected="a Service")


def test_the_helpers_rebuild_the_search_claim_and_oracle_service_exactly() -> None:
    from tensorfleet.tuning.k8s import PORT_NAME, tune_manifests

    claim, _, service, _ = tune_manifests(script="/app/t.py", image="img:1", workers=2, max_trials=4,
                                          storage="3Gi", storage_class="nfs")
    labels = {"app.kubernetes.io/name": "tune", "app.kubernetes.io/part-of": "tensorfleet"}
    assert claim == kube.claim("tune-data", namespace="default", labels=labels, size="3Gi", storage_class="nfs")
    oracle = {**labels, "app.kubernetes.io/component": "oracle"}
    assert service == kube.service("tune-oracle", namespace="default", labels=oracle, ports={PORT_NAME: 8000},
                                   selector=oracle)
