"""Every file tensorfleet reads, damaged or foreign, gives one clear error (issue 42).

Each entry point of the inventory (docs/ref-files.md) meets each damage: a missing path, an empty file, random
bytes, a valid file cut in half, a valid file of another kind, a folder where a file is expected and the reverse.
From the command line that is exit status 2 with one ``error:`` line; from Python, the documented exception. In
both the message names the path, and nothing new is left anywhere in the case's folder (no output, no temporary).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from tensorfleet.cli.main import main

RANDOM = np.random.default_rng(42).bytes(3000)


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory, keras3: Any) -> dict[str, Path]:
    """One small valid file (or folder) of every kind the inventory reads, made once for the module."""
    import tf_keras

    from tensorfleet import edge, profiling
    from tensorfleet.cluster.jobstate import JobProgress, new_rng_state
    from tensorfleet.federated.checkpoint import save_checkpoint
    from tensorfleet.serving import warmup
    from tensorfleet.serving.saved_model import export
    from tensorfleet.tuning.blackbox import search_function
    from tensorfleet.tuning.config import SearchConfig

    root = tmp_path_factory.mktemp("valid")
    files = {name: root / name for name in ("k2.keras", "k2.h5", "k3.keras", "liar.keras", "m.tflite", "x.npy",
                                            "cfg.yaml", "serving.config", "script.py", "job.py", "job.yaml", "k3sm",
                                            "base", "run", "ckpt", "job", "search", "tune")}
    k2 = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
    k2.save(files["k2.keras"])
    k2.save(files["k2.h5"])
    k3 = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
    k3.save(files["k3.keras"])
    k3.export(str(files["k3sm"]), format="tf_saved_model", verbose=False)
    # A Keras 3 model whose metadata claims Keras 2: the Keras that could read a 2.x file cannot run it.
    with zipfile.ZipFile(files["k3.keras"]) as src, zipfile.ZipFile(files["liar.keras"], "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "metadata.json":
                data = json.dumps({**json.loads(data), "keras_version": "2.21.0"}).encode()
            dst.writestr(name, data)
    edge.convert(k2, "float32").save(files["m.tflite"])
    np.save(files["x.npy"], np.zeros((3, 4), np.float32))
    files["cfg.yaml"].write_text("dataset: digits\nclients: 6\nrounds: 1\nclients_per_round: 2\n")
    files["serving.config"].write_text(f'model_config_list {{ config {{ name: "m" base_path: "{files["base"]}" '
                                       'model_platform: "tensorflow" } }\n')
    files["script.py"].write_text("def build_model(hp):\n    return None\n\n\ndef data():\n    return None\n")
    files["job.py"].write_text("def main():\n    return 1\n\n\nif __name__ == '__main__':\n    main()\n")
    files["job.yaml"].write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n")
    exported = export(k2, files["base"], 1)
    files["warm"] = root / "warm"
    shutil.copytree(files["base"], files["warm"])
    warmup.write(files["warm"] / "1", [{exported.inputs[0].name: np.zeros((1, 4), np.float32)}])
    files["sm"] = files["base"] / "1"
    files["run"].mkdir()
    (files["run"] / "metrics.json").write_text(json.dumps({"rounds": [{"round": 1, "test_accuracy": 0.5}],
                                                          "config": {"algorithm": "fedavg"}}))
    files["ckpt"].mkdir()
    save_checkpoint(files["ckpt"], [np.ones((4, 2), np.float32)], round_num=1, fingerprint="0" * 16,
                    config={"rounds": 1}, history=[])
    step = files["job"] / "step-00000001"
    step.mkdir(parents=True)
    (files["job"] / "latest.json").write_text(json.dumps({"checkpoint": step.name}))
    (step / "state.json").write_text(json.dumps(JobProgress(
        step=1, epoch=0, epochs=1, position=1, seed=0, rng=new_rng_state(0), examples=8, global_batch_size=8,
        policy="none", fingerprint="0" * 16, parameters=10, strategy="one_device", replicas=1).as_dict()))
    search_function(lambda values: values["x"], lambda hp: hp.Float("x", 0.0, 1.0), objective="score",
                    direction="max", max_trials=1, out=files["tune"], log=lambda line: None)
    files["search"].mkdir()
    shutil.copytree(files["tune"] / "oracle", files["search"] / "oracle")
    SearchConfig(script=str(files["script.py"]), out=str(files["search"]), workers=1, max_trials=1).save()
    files["prof"] = root / "prof"
    k2.compile("sgd", "mse")
    x = np.zeros((16, 4), np.float32)
    k2.fit(x, x[:, :2], batch_size=4, epochs=1, verbose=0,
           callbacks=[profiling.ProfileCallback(files["prof"], steps="2-3")])
    return files


@dataclass(frozen=True)
class Entry:
    """An entry point that reads ``valid`` (a key of the fixture): ``call(path, out, valid)`` gives the argv of a
    command, or a function for the Python API, which must raise ``error``."""

    name: str
    valid: str
    call: Callable[[Path, Path, dict[str, Path]], Any]
    error: str | None = None  # the exception's key in _error(); None: a command (exit status 2)
    other: str = "m.tflite"  # a valid file of another kind
    inner: str = ""  # for a folder: the file in it that the damages other than missing/file/empty hit
    skip: tuple[str, ...] = ()  # damages that are no damage here (an out_dir that is missing or empty: a new run)
    extra: tuple[str, ...] = ()  # damages of this entry only: other-keras (a model of the Keras that cannot run
    # here: a Keras 3 model in a file that says Keras 2, a Keras 3 SavedModel), no-signature


def _api(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: function(*args, **kwargs)


def _edge_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet import edge

    return _api(edge.load_keras_model, str(path))


def _tflite_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet import edge

    return _api(edge.TFLiteArtifact.from_file, path)


def _serving_load_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.serving.saved_model import load_keras_model

    return _api(load_keras_model, path)


def _repository_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.serving.repository import ModelRepository

    return _api(ModelRepository("m", path).load)


def _model_config_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.serving.model_config import read_model_config

    return _api(read_model_config, path)


def _load_config_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.federated.experiment import load_config

    return _api(load_config, path)


def _checkpoint_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.federated.checkpoint import read_checkpoint

    return _api(read_checkpoint, path, "0" * 16, {"rounds": 1})


def _job_state_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.cluster.jobstate import read_state

    return _api(read_state, path)


def _script_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.tuning.config import check_script

    return _api(check_script, path)


def _oracle_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.tuning.blackbox import search_function

    return _api(search_function, lambda values: 0.0, lambda hp: hp.Float("x", 0.0, 1.0), objective="score",
                direction="max", max_trials=2, out=path, resume=True, log=lambda line: None)


def _results_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.tuning.results import read_results

    return _api(read_results, path)


def _profile_api(path: Path, out: Path, valid: dict[str, Path]) -> Any:
    from tensorfleet.profiling.breakdown import analyze

    return _api(analyze, path)


def _error(name: str) -> type[BaseException]:
    """The documented exception types, by name (imported when the test runs)."""
    from tensorfleet.cluster.jobstate import CheckpointError
    from tensorfleet.compat.keras import KerasFileError
    from tensorfleet.edge.errors import InvalidModelError
    from tensorfleet.federated.checkpoint import DamagedCheckpointError
    from tensorfleet.io import UnreadableFileError
    from tensorfleet.serving.servable import SavedModelError

    return {"keras": KerasFileError, "tflite": InvalidModelError, "text": UnreadableFileError,
            "savedmodel": SavedModelError, "checkpoint": DamagedCheckpointError, "jobstate": CheckpointError,
            "value": ValueError}[name]


# File entries: each meets missing, empty, random, truncated, another kind, a folder.
FILE_ENTRIES = [
    Entry("edge convert MODEL", "k2.keras", lambda p, o, v: ["edge", "convert", str(p), "-q", "float32", "--out",
                                                            str(o / "m.tflite")], extra=("other-keras",)),
    Entry("edge convert MODEL.h5", "k2.h5", lambda p, o, v: ["edge", "convert", str(p), "-q", "float32", "--out",
                                                            str(o / "m.tflite")], other="k2.keras"),
    Entry("edge convert --data", "x.npy", lambda p, o, v: ["edge", "convert", str(v["k2.keras"]), "-q", "int8",
                                                          "--data", str(p), "--out", str(o / "m.tflite")],
          other="k2.keras"),
    Entry("edge validate", "m.tflite", lambda p, o, v: ["edge", "validate", str(p)], other="k2.keras"),
    Entry("edge validate --data", "x.npy", lambda p, o, v: ["edge", "validate", str(v["m.tflite"]), "--data", str(p)],
          other="m.tflite"),
    Entry("edge report", "m.tflite", lambda p, o, v: ["edge", "report", str(p), "--json", str(o / "r.json")],
          other="k2.keras"),
    Entry("edge export", "m.tflite", lambda p, o, v: ["edge", "export", str(p), "--name", "m", "--out", str(o)],
          other="k2.keras"),
    Entry("edge decompose", "k2.keras", lambda p, o, v: ["edge", "decompose", str(p), "--rank", "1", "--out",
                                                        str(o / "s.keras")], extra=("other-keras",)),
    Entry("serving export MODEL", "k2.keras", lambda p, o, v: ["serving", "export", str(p), str(o / "base")],
          extra=("other-keras",)),
    Entry("serve --model-config-file", "serving.config",
          lambda p, o, v: ["serve", "--model-config-file", str(p), "--host", "256.0.0.1", "--rest-api-port", "0"],
          other="k2.keras"),
    Entry("federated run --config", "cfg.yaml", lambda p, o, v: ["federated", "run", "--config", str(p), "--out",
                                                                str(o / "run"), "--no-progress"], other="k2.keras"),
    Entry("federated run --model", "k2.keras", lambda p, o, v: ["federated", "run", "--model", str(p), "--clients",
                                                               "6", "--rounds", "1", "--out", str(o / "run")],
          extra=("other-keras",)),
    Entry("federated tune --config", "cfg.yaml", lambda p, o, v: ["federated", "tune", "--config", str(p), "--out",
                                                                 str(o / "tune")], other="k2.keras"),
    Entry("k8s validate", "job.yaml", lambda p, o, v: ["k8s", "validate", str(p)], other="k2.keras"),
    Entry("k8s tf-config", "job.yaml", lambda p, o, v: ["k8s", "tf-config", str(p), "--role", "worker"],
          other="k2.keras"),
    Entry("launch SCRIPT", "job.py", lambda p, o, v: ["launch", "--workers", "1", str(p)], other="k2.keras"),
    Entry("tune SCRIPT", "script.py", lambda p, o, v: ["tune", str(p), "--out", str(o / "tune")], other="k2.keras"),
    Entry("tfl.edge.load_keras_model", "k2.keras", _edge_api, error="keras", extra=("other-keras",)),
    Entry("TFLiteArtifact.from_file", "m.tflite", _tflite_api, error="tflite", other="k2.keras"),
    Entry("tfl.serving.load_keras_model", "k2.keras", _serving_load_api, error="keras", extra=("other-keras",)),
    Entry("read_model_config", "serving.config", _model_config_api, error="value", other="k2.keras"),
    Entry("federated load_config", "cfg.yaml", _load_config_api, error="value", other="k2.keras"),
    Entry("tuning check_script", "script.py", _script_api, error="value", other="k2.keras"),
]

FILE_DAMAGES = ["missing", "empty", "random", "truncated", "other", "folder"]

FOLDER_DAMAGES = ["missing", "file", "empty-folder", "inner-empty", "inner-random", "inner-truncated", "inner-folder"]

# Folder entries: each meets missing, a file where the folder should be, an empty folder, and damage to ``inner``.
FOLDER_ENTRIES = [
    Entry("serve BASE", "base", lambda p, o, v: ["serve", str(p), "--host", "256.0.0.1", "--rest-api-port", "0",
                                                 "--file-system-poll-wait-seconds", "0"], inner="1/saved_model.pb"),
    Entry("serve BASE (warm-up records)", "warm", lambda p, o, v: ["serve", str(p), "--host", "256.0.0.1",
                                                                   "--rest-api-port", "0"],
          inner="1/assets.extra/tf_serving_warmup_requests", extra=("other",),
          skip=("inner-empty",)),  # an empty TFRecord file is a valid one, of no records
    Entry("ModelRepository.load (warm-up records)", "warm", _repository_api, error="savedmodel",
          inner="1/assets.extra/tf_serving_warmup_requests", extra=("other",), skip=("inner-empty",)),
    Entry("ModelRepository.load", "base", _repository_api, error="savedmodel",
          inner="1/saved_model.pb"),
    Entry("edge convert SAVEDMODEL", "sm", lambda p, o, v: ["edge", "convert", str(p), "-q", "float32", "--out",
                                                           str(o / "m.tflite")],
          inner="saved_model.pb", extra=("other-keras",)),
    Entry("serving export SAVEDMODEL", "sm", lambda p, o, v: ["serving", "export", str(p), str(o / "base")],
          inner="saved_model.pb", extra=("other-keras",)),
    Entry("serve BASE --stages 2", "base", lambda p, o, v: ["serve", str(p), "--stages", "2", "--host", "256.0.0.1",
                                                            "--rest-api-port", "0"], extra=("no-signature",),
          skip=FOLDER_DAMAGES),
    Entry("federated plot", "run", lambda p, o, v: ["federated", "plot", str(p)], inner="metrics.json"),
    Entry("federated run (checkpoint)", "ckpt", lambda p, o, v: [
        "federated", "run", "--dataset", "digits", "--clients", "6", "--rounds", "1", "--out", str(p),
        "--no-progress", "--no-tensorboard"], inner="checkpoint.npz", skip=("missing", "empty-folder")),
    Entry("read_checkpoint", "ckpt", _checkpoint_api, error="checkpoint", inner="checkpoint.npz",
          skip=("missing", "empty-folder")),
    Entry("launch --resume-from", "job", lambda p, o, v: ["launch", "--resume-from", str(p), str(v["script.py"])],
          inner="latest.json"),
    Entry("read_state", "job", _job_state_api, error="jobstate", inner="step-00000001/state.json"),
    Entry("tune --resume (search.json)", "search", lambda p, o, v: ["tune", str(v["script.py"]), "--out", str(p),
                                                                    "--resume", "--workers", "1", "--max-trials", "1"],
          inner="search.json"),
    Entry("tune --resume (oracle)", "search", lambda p, o, v: ["tune", str(v["script.py"]), "--out", str(p),
                                                               "--resume", "--workers", "1", "--max-trials", "1"],
          inner="oracle/oracle.json"),
    Entry("federated tune --resume", "tune", lambda p, o, v: ["federated", "tune", "--config", str(v["cfg.yaml"]),
                                                              "--out", str(p), "--resume", "--max-trials", "2"],
          inner="oracle/oracle.json"),
    Entry("profile report", "prof", lambda p, o, v: ["profile", "report", str(p), "--out", str(o)],
          inner="**/*.xplane.pb"),
    Entry("tfl.profiling.analyze", "prof", _profile_api, error="value", inner="**/*.xplane.pb"),
    Entry("federated tune --resume (times.json)", "tune", lambda p, o, v: [
        "federated", "tune", "--config", str(v["cfg.yaml"]), "--out", str(p), "--resume", "--max-trials", "2"],
          inner="times.json"),
    Entry("tuning read_results", "tune", _results_api, error="value", inner="results.json"),
    Entry("search_function resume", "tune", _oracle_api, error="value", inner="oracle/oracle.json"),
]



def _first_half(data: bytes) -> bytes:
    return data[:len(data) // 2]


# The damages that write a path of their own in place of the valid one (source -> path).
_REPLACEMENTS: dict[str, Callable[[Path, Path], object]] = {
    "empty": lambda source, path: path.write_bytes(b""),
    "file": lambda source, path: path.write_bytes(b"not a folder\n"),
    "random": lambda source, path: path.write_bytes(RANDOM),
    "truncated": lambda source, path: path.write_bytes(_first_half(source.read_bytes())),
    "no-signature": shutil.copytree,  # serving_default only, where stage signatures are asked for
    "folder": lambda source, path: path.mkdir(),
    "empty-folder": lambda source, path: path.mkdir(),
}

# The damages to the file inside a copy of the valid folder: its new bytes, from its valid ones.
_INNER_BYTES: dict[str, Callable[[bytes], bytes]] = {
    "inner-empty": lambda data: b"",
    "inner-random": lambda data: RANDOM,
    "inner-truncated": _first_half,
}


def _other_kind(source: Path, path: Path, valid: dict[str, Path], entry: Entry) -> None:
    """A valid file of another kind in place of the file (or, in a folder, of the file inside)."""
    if source.is_dir():
        shutil.copytree(source, path)
        shutil.copyfile(valid[entry.other], next(path.glob(entry.inner)))
    else:
        shutil.copyfile(valid[entry.other], path)


def _other_keras(source: Path, path: Path, valid: dict[str, Path]) -> None:
    other = valid["k3sm" if source.is_dir() else "liar.keras"]
    (shutil.copytree if other.is_dir() else shutil.copyfile)(other, path)


def _damage_inside(damage: str, source: Path, path: Path, inner_pattern: str) -> None:
    """A copy of the valid folder whose file inside is damaged (inner-folder: a folder in its place)."""
    shutil.copytree(source, path)
    inner = next(path.glob(inner_pattern))
    data = inner.read_bytes()
    inner.unlink()
    if damage in _INNER_BYTES:
        inner.write_bytes(_INNER_BYTES[damage](data))
    else:
        inner.mkdir()


def _damage(damage: str, valid: dict[str, Path], entry: Entry, where: Path) -> Path:
    """The damaged copy of ``entry``'s valid input in ``where``; its path."""
    source = valid[entry.valid]
    path = where / source.name
    if damage == "missing":
        return path
    if damage in _REPLACEMENTS:
        _REPLACEMENTS[damage](source, path)
    elif damage == "other":
        _other_kind(source, path, valid, entry)
    elif damage == "other-keras":
        _other_keras(source, path, valid)
    else:
        _damage_inside(damage, source, path, entry.inner)
    return path


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _check(entry: Entry, damage: str, tmp_path: Path, valid: dict[str, Path],
           capsys: pytest.CaptureFixture[str]) -> None:
    path = _damage(damage, valid, entry, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    before = _listing(tmp_path)
    call = entry.call(path, out, valid)
    if entry.error is None:
        status = main(call)
        err = capsys.readouterr().err
        assert status == 2, f"{entry.name}: exit status {status}\n{err}"
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1, err
        message = lines[0]
    else:
        # Nothing where something should be, or a file where a folder should be (or the reverse): FileNotFoundError
        # or the entry's own error; damaged content: the entry's own error.
        structural = damage in ("missing", "folder", "file", "empty-folder", "inner-folder")
        expected = (FileNotFoundError, _error(entry.error)) if structural else _error(entry.error)
        with pytest.raises(expected) as raised:
            call()
        message = str(raised.value)
    assert str(path) in message, message
    assert _listing(tmp_path) == before, "the case's folder holds something new"


def _cases(entries: list[Entry], damages: list[str]) -> list[Any]:
    return [pytest.param(entry, damage, id=f"{entry.name}-{damage}") for entry in entries
            for damage in [*damages, *entry.extra] if damage not in entry.skip]


@pytest.mark.parametrize(("entry", "damage"), _cases(FILE_ENTRIES, FILE_DAMAGES))
def test_a_damaged_file_is_one_clear_error(entry: Entry, damage: str, valid: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _check(entry, damage, tmp_path, valid, capsys)


@pytest.mark.parametrize(("entry", "damage"), _cases(FOLDER_ENTRIES, FOLDER_DAMAGES))
def test_a_damaged_folder_is_one_clear_error(entry: Entry, damage: str, valid: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _check(entry, damage, tmp_path, valid, capsys)

