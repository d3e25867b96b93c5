import json
import os

import pytest

from tensorfleet.io import atomic_write, write_bytes, write_json, write_text


def test_write_helpers_create_parents_and_leave_no_temporary_files(tmp_path) -> None:
    write_text(tmp_path / "a" / "t.txt", "hello")
    write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01")
    write_json(tmp_path / "a" / "j.json", {"x": 1})
    assert (tmp_path / "a" / "t.txt").read_text() == "hello"
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    assert json.loads((tmp_path / "a" / "j.json").read_text()) == {"x": 1}
    assert sorted(os.listdir(tmp_path / "a")) == ["b.bin", "j.json", "t.txt"]


def test_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path) -> None:
    target = tmp_path / "m.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as handle:
            handle.write("new, half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["m.txt"]


def test_json_writes_numpy_values(tmp_path) -> None:
    import numpy as np

    write_json(tmp_path / "n.json", {"a": np.float32(0.5), "b": np.arange(3)})
    assert json.loads((tmp_path / "n.json").read_text()) == {"a": 0.5, "b": [0, 1, 2]}


def test_bad_mode_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="mode 'w' or 'wb'. Received: mode='a'"):
        with atomic_write(tmp_path / "x", "a"):
            pass
