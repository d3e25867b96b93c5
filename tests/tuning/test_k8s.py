"""`tensorfleet k8s tune`'s manifests: schema-checked, and their pods' settings run a search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorfleet import kube
from tensorfleet.tuning.config import SearchConfig
from tensorfleet.tuning.k8s import tune_manifests, validate, write
from tests.conftest import reap

SCRIPT = str(Path(__file__).with_name("digits_search.py"))


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_manifests_are_a_claim_the_chief_its_service_and_an_indexed_worker_job():
    docs = tune_manifests(script="/app/search.py", image="tensorfleet:1", workers=3, max_trials=12,
                          algorithm="hyperband", name="digits", port=9000)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("PersistentVolumeClaim", "digits-data"), ("Job", "digits-chief"), ("Service", "digits-oracle"),
        ("Job", "digits-workers")]
    chief = _env(docs[1]["spec"]["template"]["spec"]["containers"][0])
    workers = docs[3]["spec"]
    worker = _env(workers["template"]["spec"]["containers"][0])
    assert (chief["KERASTUNER_TUNER_ID"], chief["KERASTUNER_ORACLE_IP"], chief["KERASTUNER_ORACLE_PORT"]) == (
        "chief", "0.0.0.0", "9000")
    assert (worker["KERASTUNER_TUNER_ID"], worker["KERASTUNER_ORACLE_IP"], worker["KERASTUNER_ORACLE_PORT"]) == (
        "tuner$(TUNER_INDEX)", "digits-oracle.default.svc", "9000")
    assert worker["TUNER_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert (workers["completions"], workers["parallelism"], workers["completionMode"]) == (3, 3, "Indexed")
    assert docs[2]["spec"]["selector"] == docs[1]["spec"]["template"]["metadata"]["labels"]
    config = SearchConfig(**json.loads(chief["TENSORFLEET_TUNE_CONFIG"]))
    assert (config.script, config.out_dir, config.workers, config.max_trials, config.algorithm.value) == (
        "/app/search.py", "/search", 3, 12, "hyperband")


def test_written_manifests_load_back_and_a_broken_one_is_refused(tmp_path):
    docs = tune_manifests(script="/app/search.py", image="tensorfleet:1", workers=2, max_trials=4)
    path = write(docs, tmp_path / "tune.yaml")
    assert kube.load_yaml(path.read_text()) == docs
    docs[3]["spec"]["completions"] = "two"
    with pytest.raises(kube.ManifestError, match="Document 3 \\(Job\\) is not a valid Kubernetes Job"):
        validate(docs)


@pytest.mark.parametrize(("options", "message"), [
    ({"script": "search.py"},
     "script must be an absolute path inside the container image. Received: script='search.py'"),
    ({"workers": 0}, "workers must be a positive integer. Received: workers=0"),
    ({"algorithm": "grid"}, "algorithm must be one of 'random', 'bayesian', 'hyperband'. Received: algorithm='grid'"),
])
def test_bad_options_are_refused(options, message):
    arguments = {"script": "/app/search.py", "image": "tensorfleet:1", "workers": 2, "max_trials": 4, **options}
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        tune_manifests(**arguments)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_pods_settings_run_a_search(tmp_path):
    """The chief's and worker 0's command and environment from the manifests, run here: the Service
    name and the chief's every-address bind become 127.0.0.1, the claim a temporary directory."""
    import portpicker

    port = portpicker.pick_unused_port()
    docs = tune_manifests(script=SCRIPT, image="tensorfleet:1", workers=1, max_trials=2, epochs=1, batch_size=64,
                          out_dir=str(tmp_path), port=port)
    processes = []
    try:
        for doc, index in ((docs[1], None), (docs[3], 0)):
            container = doc["spec"]["template"]["spec"]["containers"][0]
            env = {k: v for k, v in _env(container).items() if isinstance(v, str)}
            env["KERASTUNER_ORACLE_IP"] = "127.0.0.1"
            env["KERASTUNER_TUNER_ID"] = env["KERASTUNER_TUNER_ID"].replace("$(TUNER_INDEX)", str(index))
            argv = [sys.executable, *container["command"][1:]]
            processes.append(subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=100)[0] for p in processes]
    finally:
        for process in processes:
            reap(process)
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert "tensorfleet-tune: search ended: 2 of 2 trials completed" in outputs[0]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert [t["status"] for t in summary["trials"]] == ["COMPLETED", "COMPLETED"]
    assert (tmp_path / "best_model.keras").exists()


def test_the_k8s_tune_command_writes_the_manifests(tmp_path):
    import typer
    from typer.testing import CliRunner

    from tensorfleet.cli.tune import k8s_tune_command

    app = typer.Typer()
    app.command("tune")(k8s_tune_command)
    app.command("other")(lambda: None)  # a group, as `tensorfleet k8s` is
    out = tmp_path / "tune.yaml"
    result = CliRunner().invoke(app, ["tune", "/app/search.py", "--image", "tensorfleet:1", "--workers", "2",
                                      "--max-trials", "8", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (f"wrote {out}: PersistentVolumeClaim tune-data, Job tune-chief, "
                                     "Service tune-oracle, Job tune-workers")
    assert kube.load_yaml(out.read_text()) == tune_manifests(script="/app/search.py", image="tensorfleet:1",
                                                             workers=2, max_trials=8)
