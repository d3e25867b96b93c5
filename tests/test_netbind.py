"""The LD_PRELOAD bind library: built once, verified against its recorded hash before every use."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tensorfleet import netbind

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="needs a C compiler to build the library")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "tensorfleet"


def _record(path: Path) -> str:
    return path.with_name(path.name + ".sha256").read_text().split()[0]


@pytest.mark.slow
def test_the_library_is_built_with_its_hash_recorded_beside_it(cache: Path) -> None:
    path = netbind.bind_shim_path()
    assert path is not None and path.parent == cache
    assert path.read_bytes()[:4] == b"\x7fELF"
    assert _record(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert netbind.bind_shim_path() == path  # the verified cache is reused
    assert netbind.loopback_env("127.0.0.1", environ={})["LD_PRELOAD"] == str(path)


@pytest.mark.parametrize("tamper", ["replace", "append", "drop_record"])
@pytest.mark.slow
def test_a_changed_cached_library_is_rebuilt_not_used(cache: Path, tamper: str) -> None:
    path = netbind.bind_shim_path()
    assert path is not None
    built = path.read_bytes()
    if tamper == "replace":
        path.write_bytes(b"\x7fELF not the library tensorfleet built")
    elif tamper == "append":
        path.write_bytes(built + b"\0")
    else:
        path.with_name(path.name + ".sha256").unlink()
    tampered = path.read_bytes()
    again = netbind.bind_shim_path()
    assert again == path
    rebuilt = again.read_bytes()
    assert rebuilt[:4] == b"\x7fELF" and (rebuilt != tampered or tamper == "drop_record")
    assert hashlib.sha256(rebuilt).hexdigest() == _record(again)
