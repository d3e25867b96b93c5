"""`tensorfleet k8s tfjob|validate|tf-config` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tensorfleet import kube
from tensorfleet.cli.main import main
from tensorfleet.cluster import k8s


def test_tfjob_writes_a_valid_manifest_with_the_command_after_dashes(tmp_path: Path, capsys) -> None:
    out = tmp_path / "job.yaml"
    assert main(["k8s", "tfjob", "--name", "digits", "--image", "img:1", "--workers", "2", "--chief",
                 "--env", "EPOCHS=6", "-o", str(out), "--", "python", "train.py", "--epochs", "6"]) == 0
    assert "wrote" in capsys.readouterr().err
    docs = kube.load_yaml(out.read_text())
    k8s.validate(docs)
    container = docs[1]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "train.py", "--epochs", "6"]
    assert {"name": "EPOCHS", "value": "6"} in container["env"]


def test_tfjob_prints_yaml_and_takes_a_quoted_command(capsys) -> None:
    assert main(["k8s", "tfjob", "--name", "digits", "--image", "img:1", "--workers", "1", "--ps", "1",
                 "--command", "python train.py --epochs '6'"]) == 0
    docs = kube.load_yaml(capsys.readouterr().out)
    assert docs[1]["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "train.py", "--epochs", "6"]


def test_validate_and_tf_config_read_a_manifest(tmp_path: Path, capsys) -> None:
    path = tmp_path / "job.yaml"
    k8s.write(k8s.tfjob(name="digits", image="img:1", workers=2, command=["python", "t.py"]), path)
    assert main(["k8s", "validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: valid (PersistentVolumeClaim, TFJob)"
    assert main(["k8s", "tf-config", str(path), "--role", "worker", "--index", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "cluster": {"worker": ["digits-worker-0.default.svc:2222", "digits-worker-1.default.svc:2222"]},
        "task": {"type": "worker", "index": 1}, "environment": "cloud"}


def test_validate_reports_an_invalid_manifest(tmp_path: Path, capsys) -> None:
    path = tmp_path / "job.yaml"
    text = kube.dump_yaml(k8s.tfjob(name="digits", image="img:1", workers=2, command=["python", "t.py"]))
    path.write_text(text.replace("restartPolicy: OnFailure", "restartPolicy: Sometimes", 1))
    assert main(["k8s", "validate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: '{path}': TFJob 'digits' is invalid at spec/tfReplicaSpecs/Worker/restartPolicy: 'Sometimes' is "
        "not one of")


def test_validate_refuses_a_key_given_twice(tmp_path: Path, capsys) -> None:
    # A hand-edited manifest that sets the image twice: PyYAML kept the second one silently and called it valid.
    path = tmp_path / "job.yaml"
    text = kube.dump_yaml(k8s.tfjob(name="digits", image="img:1", workers=2, command=["python", "t.py"]))
    first = text.index("image: img:1")
    indent = text[text.rindex("\n", 0, first) + 1:first]
    path.write_text(text.replace("image: img:1\n", f"image: img:1\n{indent}image: img:2\n", 1))
    line = text[:first].count("\n") + 1
    assert main(["k8s", "validate", str(path)]) == 2
    assert capsys.readouterr().err == (f"error: '{path}': The manifest is not valid YAML: the key 'image' is given "
                                       f"twice (first at line {line}) (line {line + 1}, column {len(indent) + 1})\n")


def test_tfjob_bad_input_is_one_clear_error(tmp_path: Path, capsys) -> None:
    base = ["k8s", "tfjob", "--name", "digits", "--image", "img:1"]
    assert main([*base, "--workers", "0", "--command", "python t.py"]) == 2
    assert capsys.readouterr().err.strip() == ("error: A TFJob needs at least one worker (or a chief). Received: "
                                               "workers=0")
    assert main([*base, "--workers", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: A TFJob needs the trainer's command")
    assert main([*base, "--workers", "1", "--env", "NOEQUALS", "--command", "python t.py"]) == 2
    assert capsys.readouterr().err.strip() == "error: --env takes KEY=VALUE. Received: --env 'NOEQUALS'"
    assert main(["k8s", "validate", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: No file at")


def test_tfjob_mesh_sets_the_variable_on_the_workers_and_refuses_other_tasks(capsys) -> None:
    base = ["k8s", "tfjob", "--name", "mesh", "--image", "img:1", "--workers", "2", "--mesh"]
    assert main([*base, "--command", "python train.py"]) == 0
    job = kube.load_yaml(capsys.readouterr().out)[1]
    (container,) = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["env"][-1] == {"name": "TENSORFLEET_MESH_ACROSS_PROCESSES", "value": "1"}
    assert main([*base, "--chief", "--command", "python train.py"]) == 2
    assert capsys.readouterr().err.strip() == ("error: A mesh across processes (mesh=True, --mesh) runs workers only, "
                                               "each a process of the mesh; drop the chief. Received: chief=1")


def test_tfjob_storage_class_names_the_class_of_the_claim(capsys) -> None:
    assert main(["k8s", "tfjob", "--name", "digits", "--image", "img:1", "--workers", "2",
                 "--storage-class", "nfs-client", "--command", "python t.py"]) == 0
    pvc, job = kube.load_yaml(capsys.readouterr().out)
    k8s.validate([pvc, job])
    assert pvc["spec"]["storageClassName"] == "nfs-client"
    assert main(["k8s", "tfjob", "--name", "digits", "--image", "img:1", "--workers", "2",
                 "--storage-class", "Fast_SSD", "--command", "python t.py"]) == 2
    assert capsys.readouterr().err.strip().endswith("Received: storage_class='Fast_SSD'")


def test_serving_writes_a_valid_deployment_service_and_autoscaler(tmp_path: Path, capsys) -> None:
    from tensorfleet.serving import k8s as sk8s

    out = tmp_path / "serving.yaml"
    assert main(["k8s", "serving", "--name", "digits", "--image", "img:1", "--min-replicas", "2", "--max-replicas",
                 "5", "--target-cpu", "70", "--model-name", "mnist", "-o", str(out), "--", "--enable-batching"]) == 0
    assert capsys.readouterr().err.strip() == (
        f"wrote {out} (Deployment, Service, HorizontalPodAutoscaler), valid against Kubernetes "
        f"{kube.KUBERNETES_VERSION}")
    deployment, service, hpa = kube.load_yaml(out.read_text())
    sk8s.validate([deployment, service, hpa])
    assert "replicas" not in deployment["spec"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "tensorfleet", "serve", "/models/digits", "--model-name", "mnist", "--host", "0.0.0.0", "--port", "8500",
        "--rest-api-port", "8501", "--enable-batching"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    assert main(["k8s", "validate", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: valid (Deployment, Service, HorizontalPodAutoscaler)"
    out.write_text(out.read_text().replace("averageUtilization: 70", "averageUtilization: high"))
    assert main(["k8s", "validate", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: '{out}': Document 2 (HorizontalPodAutoscaler) is not a valid Kubernetes HorizontalPodAutoscaler: "
        "'high' is not of type 'integer', 'null' (at spec/metrics/0/resource/target/averageUtilization)")


def test_serving_bad_input_is_one_clear_error(tmp_path: Path, capsys) -> None:
    base = ["k8s", "serving", "--image", "img:1", "-o", str(tmp_path / "s.yaml")]
    assert main([*base, "--name", "Digits"]) == 2
    assert capsys.readouterr().err.strip().endswith("Received: name='Digits'")
    assert main([*base, "--name", "digits", "--replicas", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: replicas must be a positive integer. Received: replicas=0"
    assert main([*base, "--name", "digits", "--min-replicas", "3", "--max-replicas", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: min_replicas must not exceed max_replicas. Received: min_replicas=3, max_replicas=2")
    assert list(tmp_path.iterdir()) == []


def test_k8s_tune_writes_the_search_manifests(tmp_path: Path, capsys) -> None:
    out = tmp_path / "tune.yaml"
    assert main(["k8s", "tune", "/app/tune_digits.py", "--image", "img:1", "--workers", "3", "--max-trials", "6",
                 "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {out}: PersistentVolumeClaim tune-data, Job tune-chief, Service tune-oracle, Job tune-workers")
    assert kube.load_yaml(out.read_text())[3]["spec"]["completions"] == 3
