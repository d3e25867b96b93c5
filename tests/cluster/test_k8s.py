"""TFJob manifests: structure, validation against the TFJob schema and the core Kubernetes
schemas, and the TF_CONFIG each pod would get compared with the local launcher's."""

from __future__ import annotations

import copy

import pytest

from tensorfleet import kube
from tensorfleet.cluster import k8s
from tensorfleet.strategies.tf_config import ClusterSpec, parse_tf_config


def _job(**kw):
    options = dict(name="digits", image="registry.example/train:1", workers=2,
                   command=["python", "train.py", "--epochs", "6"])
    options.update(kw)
    return k8s.tfjob(**options)


def test_collective_job_has_the_replicas_restart_policy_resources_volume_and_env() -> None:
    pvc, job = _job(chief=True, evaluator=True, max_restarts=4, cpu="2", memory="4Gi", env={"EPOCHS": "6"})
    k8s.validate([pvc, job])
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"]["name"] == "digits-backup"
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 4}
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "Evaluator": 1}
    for spec in specs.values():
        assert spec["restartPolicy"] == "OnFailure"
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "tensorflow"
        assert container["command"] == ["python", "train.py", "--epochs", "6"]
        assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"},
                                          "limits": {"cpu": "2", "memory": "4Gi"}}
        assert {e["name"]: e["value"] for e in container["env"]} == {
            "TENSORFLEET_BACKUP_DIR": "/backup", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "EPOCHS": "6"}
        assert container["volumeMounts"] == [{"name": "backup", "mountPath": "/backup"}]
        assert pod["volumes"] == [{"name": "backup", "persistentVolumeClaim": {"claimName": "digits-backup"}}]


def test_parameter_server_job_runs_the_command_on_the_chief_and_servers_elsewhere() -> None:
    (job,) = _job(ps=1, gpus=1, backup_claim="shared-nfs")
    k8s.validate(job)
    specs = job["spec"]["tfReplicaSpecs"]
    assert sorted(specs) == ["Chief", "PS", "Worker"]
    command = {k: v["template"]["spec"]["containers"][0]["command"] for k, v in specs.items()}
    assert command == {"Chief": ["python", "train.py", "--epochs", "6"],
                       "Worker": ["python", "-P", "-m", "tensorfleet.cluster.launcher", "--serve"],
                       "PS": ["python", "-P", "-m", "tensorfleet.cluster.launcher", "--serve"]}
    limits = {k: v["template"]["spec"]["containers"][0]["resources"]["limits"] for k, v in specs.items()}
    assert limits["Chief"]["nvidia.com/gpu"] == "1" and "nvidia.com/gpu" not in limits["PS"]
    # Only the chief writes backups in a ps job: the servers get neither the claim nor the directory.
    chief = specs["Chief"]["template"]["spec"]
    assert chief["volumes"] == [{"name": "backup", "persistentVolumeClaim": {"claimName": "shared-nfs"}}]
    assert chief["containers"][0]["volumeMounts"] == [{"name": "backup", "mountPath": "/backup"}]
    assert {"name": "TENSORFLEET_BACKUP_DIR", "value": "/backup"} in chief["containers"][0]["env"]
    for server in ("Worker", "PS"):
        pod = specs[server]["template"]["spec"]
        assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0], server
        assert {e["name"]: e["value"] for e in pod["containers"][0]["env"]} == {
            "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}, server


def test_storage_class_names_the_class_of_the_claim_and_is_schema_checked() -> None:
    pvc, job = _job(storage_class="nfs-client")
    k8s.validate([pvc, job])
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}},
                           "storageClassName": "nfs-client"}
    bad = copy.deepcopy(pvc)
    bad["spec"]["storageClassName"] = 7
    with pytest.raises(kube.ManifestError, match="storageClassName"):
        k8s.validate([bad, job])


def test_storage_class_with_an_existing_claim_is_a_clear_error() -> None:
    with pytest.raises(ValueError) as info:
        _job(storage_class="nfs-client", backup_claim="shared-nfs")
    assert str(info.value) == ("storage_class applies to the claim tensorfleet writes, not to an existing one. "
                               "Received: storage_class='nfs-client' with backup_claim='shared-nfs'; drop one of them.")


@pytest.mark.parametrize(("workers", "ps", "chief", "evaluator"),
                         [(2, 0, False, False), (3, 0, True, True), (2, 1, True, False), (1, 2, True, True)])
def test_each_pod_gets_the_tf_config_the_launcher_gives_the_same_task(workers, ps, chief, evaluator) -> None:
    docs = _job(workers=workers, ps=ps, chief=chief, evaluator=evaluator)
    k8s.validate(docs)
    local = ClusterSpec.local(workers=workers, ps=ps, chief=chief, evaluator=evaluator)
    for task in local.tasks():
        pod = k8s.pod_tf_config(docs, task.role, task.index)
        launcher = local.tf_config(task.role, task.index)
        assert pod["task"] == launcher["task"]
        # Same task types and counts; the operator leaves the evaluator out of the cluster.
        expected = {r: len(a) for r, a in launcher["cluster"].items() if r != "evaluator"}
        assert {r: len(a) for r, a in pod["cluster"].items()} == expected
        for role, addresses in pod["cluster"].items():
            assert addresses == [f"digits-{role}-{i}.default.svc:2222" for i in range(len(addresses))]
        if task.role != "evaluator":
            parsed = parse_tf_config(pod)
            assert (parsed.task.role, parsed.task.index) == (task.role, task.index)


def test_pod_tf_config_uses_the_namespace_port_and_cluster_domain() -> None:
    (job,) = _job(namespace="ml", port=2345, backup_claim="c")
    config = k8s.pod_tf_config(job, "worker", 0, cluster_domain="cluster.local")
    assert config == {"cluster": {"worker": ["digits-worker-0.ml.svc.cluster.local:2345",
                                             "digits-worker-1.ml.svc.cluster.local:2345"]},
                      "task": {"type": "worker", "index": 0}, "environment": "cloud"}


def test_yaml_round_trip_and_atomic_write(tmp_path) -> None:
    docs = _job(chief=True)
    path = tmp_path / "job.yaml"
    k8s.write(docs, path)
    assert kube.load_yaml(path.read_text()) == docs
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]


# ---------------------------------------------------------------- validation catches


def _broken(mutate) -> list:
    docs = copy.deepcopy(_job())
    mutate(docs[1])
    return docs


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda j: j.update(apiVersion="kubeflow.org/v2"),
     "TFJob 'digits' is invalid at apiVersion: 'kubeflow.org/v1' was expected"),
    (lambda j: j["spec"]["tfReplicaSpecs"].update(Trainer=j["spec"]["tfReplicaSpecs"]["Worker"]),
     "TFJob 'digits' is invalid at spec/tfReplicaSpecs: 'Trainer' is not one of"),
    (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"].update(restartPolicy="Sometimes"),
     "TFJob 'digits' is invalid at spec/tfReplicaSpecs/Worker/restartPolicy: 'Sometimes' is not one of"),
    (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"].update(replicas=-1),
     "TFJob 'digits' is invalid at spec/tfReplicaSpecs/Worker/replicas: -1 is less than the minimum of 0"),
    (lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy="Some"),
     "TFJob 'digits' is invalid at spec/runPolicy/cleanPodPolicy: 'Some' is not one of"),
    (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(bogus=1),
     "tfReplicaSpecs/Worker/template is not a valid Kubernetes PodTemplate: Additional properties are not allowed "
     "('bogus' was unexpected)"),
    (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"][0].update(
        containerPort="2222"),
     "tfReplicaSpecs/Worker/template is not a valid Kubernetes PodTemplate: '2222' is not of type 'integer'"),
    (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(name="trainer"),
     "tfReplicaSpecs/Worker: the training operator needs a container named 'tensorflow'. Received: ['trainer']"),
    (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"].update(restartPolicy="Always"),
     "tfReplicaSpecs/Worker: set restartPolicy on the replica spec, not in the pod template."),
    (lambda j: j["spec"]["tfReplicaSpecs"].update(Chief={**j["spec"]["tfReplicaSpecs"]["Worker"], "replicas": 2}),
     "A TFJob has at most one Chief replica. Received: replicas=2"),
])
def test_invalid_manifests_are_rejected_with_the_place_and_reason(mutate, message) -> None:
    with pytest.raises(kube.ManifestError) as info:
        k8s.validate(_broken(mutate))
    assert str(info.value).startswith(message), str(info.value)


def test_invalid_claim_is_rejected_by_the_core_schema() -> None:
    docs = copy.deepcopy(_job())
    docs[0]["spec"]["accessModes"] = "ReadWriteMany"
    with pytest.raises(kube.ManifestError, match=r"^Document 0 \(PersistentVolumeClaim\) is not a valid Kubernetes "
                                                 r"PersistentVolumeClaim: 'ReadWriteMany' is not of type 'array'"):
        k8s.validate(docs)


def test_manifest_without_a_tfjob_is_rejected() -> None:
    with pytest.raises(kube.ManifestError,
                       match=r"^The manifest has no TFJob\. Received kinds: \['PersistentVolumeClaim'\]$"):
        k8s.validate(_job()[:1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "Digits"}, "name must be a DNS label of at most 40 characters (lower-case letters, digits and '-', "
                         "starting and ending with a letter or digit). Received: name='Digits'"),
    ({"workers": 0}, "A TFJob needs at least one worker (or a chief). Received: workers=0"),
    ({"workers": -1}, "workers must be an integer >= 0. Received: workers=-1"),
    ({"command": "python train.py"},
     "command must be a non-empty list of strings. Received: command='python train.py'"),
    ({"image": ""}, "image must be a container image reference without spaces. Received: image=''"),
    ({"image": "my image"}, "image must be a container image reference without spaces. Received: image='my image'"),
    ({"port": 70000}, "port must be an integer from 1 to 65535. Received: port=70000"),
    ({"restart_policy": "Sometimes"}, "restart_policy must be one of 'Always', 'OnFailure', 'Never', 'ExitCode'. "
                                      "Received: restart_policy='Sometimes'"),
    ({"memory": "lots"}, "memory must be a Kubernetes quantity such as '1', '500m' or '2Gi'. Received: memory='lots'"),
    ({"env": {"TF_CONFIG": "{}"}}, "env must not set TF_CONFIG: the training operator gives each pod its own."),
    ({"storage_class": "Fast_SSD"}, "storage_class must be a DNS subdomain of at most 253 characters (DNS labels "
                                    "joined by '.': lower-case letters, digits and '-'). Received: "
                                    "storage_class='Fast_SSD'"),
])
def test_bad_arguments_are_clear_errors(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        _job(**kwargs)
    assert str(info.value).startswith(message)


def test_pod_tf_config_rejects_unknown_roles_and_indices() -> None:
    docs = _job()
    with pytest.raises(ValueError, match=r"^The TFJob has no 'ps' replicas\. It has: \['worker'\]$"):
        k8s.pod_tf_config(docs, "ps", 0)
    with pytest.raises(ValueError, match=r"^index must be an integer from 0 to 1\. Received: index=2$"):
        k8s.pod_tf_config(docs, "worker", 2)


def test_a_mesh_job_sets_the_mesh_variable_on_every_worker_and_their_dtensor_clients_follow() -> None:
    """``mesh=True`` (``tensorfleet k8s tfjob --mesh``): each worker's Mesh takes the TFJob's workers as DTensor's
    clients, the way ``launch --mesh`` does locally."""
    import json

    from tensorfleet.model_parallel.mesh.clients import env_from_tf_config

    pvc, job = _job(workers=3, mesh=True, env={"EPOCHS": "6"})
    k8s.validate([pvc, job])
    assert list(job["spec"]["tfReplicaSpecs"]) == ["Worker"]
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    (container,) = worker["template"]["spec"]["containers"]
    assert container["command"] == ["python", "train.py", "--epochs", "6"]
    assert container["env"] == [
        {"name": "TENSORFLEET_BACKUP_DIR", "value": "/backup"}, {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}, {"name": "EPOCHS", "value": "6"},
        {"name": "TENSORFLEET_MESH_ACROSS_PROCESSES", "value": "1"}]
    jobs = ",".join(f"digits-worker-{i}.default.svc:2222" for i in range(3))
    assert [env_from_tf_config(json.dumps(k8s.pod_tf_config([job], "worker", i))) for i in range(3)] == [
        {"DTENSOR_JOBS": jobs, "DTENSOR_CLIENT_ID": str(i), "DTENSOR_NUM_CLIENTS": "3", "DTENSOR_JOB_NAME": "worker"}
        for i in range(3)]
    assert _job(mesh=True, env={"TENSORFLEET_MESH_ACROSS_PROCESSES": "1"}) == _job(mesh=True)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ps": 1}, "A mesh across processes (mesh=True, --mesh) runs workers only, each a process of the mesh; drop "
                "the ps. Received: ps=1"),
    ({"chief": True, "evaluator": True}, "A mesh across processes (mesh=True, --mesh) runs workers only, each a "
                                         "process of the mesh; drop the chief, evaluator. Received: chief=1, "
                                         "evaluator=1"),
    ({"env": {"DTENSOR_CLIENT_ID": "0"}}, "env must not set DTensor's variables with mesh=True: each task's own "
                                          "come from its TF_CONFIG. Received: DTENSOR_CLIENT_ID"),
    ({"env": {"TENSORFLEET_MESH_ACROSS_PROCESSES": "0"}},
     "mesh=True (--mesh) sets TENSORFLEET_MESH_ACROSS_PROCESSES=1 in every worker; env must not set it otherwise. "
     "Received: TENSORFLEET_MESH_ACROSS_PROCESSES='0'"),
])
def test_a_mesh_job_refuses_what_does_not_fit_a_mesh(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        _job(mesh=True, **kwargs)
    assert str(info.value) == message
