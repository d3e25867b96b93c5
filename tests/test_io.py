import json
import os
import stat
from pathlib import Path

import pytest

from tensorfleet.io import UnwritablePathError, atomic_write, check_writable, write_bytes, write_json, write_text


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


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_files_are_created_with_the_umasks_mode(tmp_path, umask, expected) -> None:
    old = os.umask(umask)
    try:
        written = [write_text(tmp_path / "t.txt", "x"), write_bytes(tmp_path / "b.bin", b"x"),
                   write_json(tmp_path / "j.json", {})]
    finally:
        os.umask(old)
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {oct(expected)}


def test_unwritable_destinations_are_named_as_given_not_as_a_temporary(tmp_path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UnwritablePathError, match=rf"Cannot write '{a_file}/m.tflite': '{a_file}' is a file, "
                                                  r"not a directory\. Choose a path you can write to\.") as info:
        write_bytes(a_file / "m.tflite", b"x")
    assert ".tmp" not in str(info.value) and isinstance(info.value, ValueError)
    with pytest.raises(UnwritablePathError, match=rf"Cannot write '{tmp_path}': it is a directory; give a file name"):
        check_writable(tmp_path)
    with pytest.raises(UnwritablePathError, match=rf"Cannot write '{tmp_path}': it is a directory"):
        write_text(tmp_path, "x")
    assert sorted(os.listdir(tmp_path)) == ["file"]
    assert check_writable(tmp_path / "new" / "deeper" / "m.tflite") == tmp_path / "new" / "deeper" / "m.tflite"
    assert sorted(os.listdir(tmp_path)) == ["file"]  # the check leaves nothing behind


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs sysfs, where not even root may create files")
def test_a_directory_nobody_may_write_is_refused_before_writing() -> None:
    with pytest.raises(UnwritablePathError, match=r"Cannot write '/sys/m.tflite': permission denied in '/sys'\."):
        check_writable("/sys/m.tflite")
    with pytest.raises(UnwritablePathError, match=r"Cannot write '/sys/m.tflite': permission denied in '/sys'\."):
        write_bytes("/sys/m.tflite", b"x")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write read-only files")
def test_a_read_only_file_is_refused(tmp_path) -> None:
    target = tmp_path / "m.tflite"
    target.write_text("old")
    target.chmod(0o444)
    with pytest.raises(UnwritablePathError, match="the file is read-only"):
        check_writable(target)
