"""A damaged checkpoint is named, the previous generation is fallen back to, and the CLI says what to do."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from tensorfleet.cli.main import main
from tensorfleet.federated import checkpoint
from tensorfleet.federated.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE, DamagedCheckpointError

CONFIG = {"algorithm": "fedavg", "rounds": 3, "seed": 0}


def _save(out, round_num, value):
    mark = checkpoint.fingerprint(CONFIG, ["c0"])
    checkpoint.save_checkpoint(out, [np.full(3, value)], round_num=round_num, fingerprint=mark, config=CONFIG,
                               history=[{"round": r} for r in range(1, round_num + 1)])
    return mark


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_the_previous_generation_is_kept_and_read_when_the_latest_is_damaged(tmp_path):
    _save(tmp_path, 1, 1.0)
    mark = _save(tmp_path, 2, 2.0)
    latest, previous = tmp_path / CHECKPOINT_FILE, tmp_path / PREVIOUS_FILE
    assert checkpoint.read_checkpoint(tmp_path, mark, CONFIG)[1] == 2
    for damage in (_truncate, lambda p: p.write_bytes(b"not a checkpoint at all" * 40)):
        damage(latest)
        with pytest.warns(RuntimeWarning, match=rf"The checkpoint {latest} is damaged \(.*\)\. Resuming from the "
                                                rf"previous generation, {previous} \(round 1\)\."):
            leaves, round_num, history = checkpoint.read_checkpoint(tmp_path, mark, CONFIG)
        assert (leaves[0].tolist(), round_num, history) == ([1.0, 1.0, 1.0], 1, [{"round": 1}])
        _save(tmp_path, 2, 2.0)  # a damaged latest does not replace the good previous generation
        assert checkpoint.read_checkpoint(tmp_path, mark, CONFIG)[1] == 2
        assert checkpoint.read_checkpoint(tmp_path / "..", "x", {}) is None  # no checkpoint there


def test_damaged_latest_and_previous_raise_one_error_naming_the_file(tmp_path):
    _save(tmp_path, 1, 1.0)
    mark = _save(tmp_path, 2, 2.0)
    latest, previous = tmp_path / CHECKPOINT_FILE, tmp_path / PREVIOUS_FILE
    _truncate(latest)
    previous.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with pytest.raises(DamagedCheckpointError) as caught:
        checkpoint.read_checkpoint(tmp_path, mark, CONFIG)
    assert str(caught.value) == (f"The checkpoint {latest} is damaged (truncated: BadZipFile: File is not a zip "
                                 f"file); so is the previous generation {previous}. Start over with resume=False (it "
                                 f"overwrites the checkpoint), or use another out_dir.")
    assert caught.value.path == latest and checkpoint.checkpoint_config(tmp_path) is None
    previous.unlink()
    latest.write_bytes(b"garbage")
    with pytest.raises(DamagedCheckpointError, match=r"is damaged \(not a checkpoint: not an \.npz archive, it "
                                                     r"starts with b'garb'\)\."):
        checkpoint.read_checkpoint(tmp_path, mark, CONFIG)


def test_an_npz_without_the_checkpoint_entries_is_not_a_checkpoint(tmp_path):
    np.savez(tmp_path / CHECKPOINT_FILE, something=np.ones(2))
    with pytest.raises(DamagedCheckpointError, match=r"is damaged \(not a checkpoint: KeyError"):
        checkpoint.read_checkpoint(tmp_path, "x", CONFIG)
    assert zipfile.is_zipfile(tmp_path / CHECKPOINT_FILE)


def test_the_cli_names_a_damaged_checkpoint_and_resumes_after_fresh(capsys, tmp_path):
    out = tmp_path / "run"
    run = ["federated", "run", "--clients", "10", "--clients-per-round", "2", "--model", "digits_mlp",
           "--out", str(out), "--checkpoint-every", "1", "--no-progress"]
    assert main([*run, "--rounds", "1"]) == 0
    latest = out / CHECKPOINT_FILE
    garbage = np.arange(64, dtype=np.uint8).tobytes()
    for damage, kind in ((_truncate, "truncated: BadZipFile"),
                         (lambda p: p.write_bytes(garbage), f"not a checkpoint: not an .npz archive, it starts with "
                                                            f"{garbage[:4]!r})")):
        damage(latest)
        capsys.readouterr()
        assert main([*run, "--rounds", "2"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: The checkpoint {latest} is damaged ({kind}") and "Traceback" not in err
        assert err.rstrip().endswith("Run with --fresh to start over (it overwrites the checkpoint), or use another "
                                     "--out.")
    assert main([*run, "--rounds", "2", "--fresh"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rounds"] == 2
    assert (out / PREVIOUS_FILE).is_file()  # round 1's generation, kept beside round 2's
    _truncate(latest)
    with pytest.warns(RuntimeWarning, match="Resuming from the previous generation"):
        assert main([*run, "--rounds", "3"]) == 0
    assert [r["round"] for r in json.loads((out / "metrics.json").read_text())["rounds"]] == [1, 2, 3]


def test_the_cli_backend_and_straggler_choices_are_enums(capsys):
    assert main(["federated", "run", "--rounds", "1", "--backend", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--backend'" in err and "'gpu' is not one of" in err and "'compiled'" in err
    assert main(["federated", "run", "--rounds", "1", "--straggler-policy", "wait"]) == 2
    assert "Invalid value for '--straggler-policy'" in capsys.readouterr().err
