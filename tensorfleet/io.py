"""Atomic file writing: nothing half-written is ever left behind.

Every file tensorfleet writes (checkpoints, metrics, plots, C sources, manifests) goes
through :func:`atomic_write` or one of its helpers: the data goes to a temporary file in the
same directory, is flushed and fsynced, then renamed over the target. The file is created with
mode 0666 less the process's umask, as ``open()`` would create it (not ``mkstemp``'s 0600).
Commands that work long before they write call :func:`check_writable` first, so an unwritable
destination fails at once, named as the user gave it.

Reading, the other way round: :func:`existing_file`, :func:`existing_folder` and :func:`read_text`
say in one line what is at a path the user gave when it is not what was expected (nothing, a
folder where a file should be or the reverse, binary bytes or nothing where text should be).
YAML the user wrote is read with :func:`unique_keys_loader`, which refuses a key given twice
instead of keeping the last.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import IO, Any, Iterator

__all__ = ["UnreadableFileError", "UnwritablePathError", "atomic_write", "check_out_dir", "existing_file",
           "existing_folder", "read_text", "check_writable", "write_bytes", "write_text", "write_json",
           "save_figure", "unique_keys_loader"]


class UnwritablePathError(PermissionError, ValueError):
    """A file cannot be written where asked (read-only, not a directory, no permission).

    A ``ValueError`` too, so command lines report it as bad input in one line.
    """


class UnreadableFileError(ValueError):
    """A file is there but does not hold what was expected (binary bytes or nothing where text should be, a
    damaged archive, another kind of file). The message names the file, what was found and what was expected."""


def _found(path: Path) -> str:
    if path.is_dir():
        return "a folder"
    if path.exists():
        return "a file" if path.is_file() else "something that is neither a file nor a folder"
    return "nothing"


def existing_file(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a :class:`Path` if it is a file; else FileNotFoundError naming it and what is there.

    Args:
        what: what was expected, for the message ("a YAML config file", "a .tflite file").

    Example:
        >>> existing_file("/", "a YAML config file")
        Traceback (most recent call last):
        FileNotFoundError: No file at '/': a folder is there; expected a YAML config file.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"No file at {str(p)!r}: {_found(p)} is there; expected {what}.")
    return p


def existing_folder(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a :class:`Path` if it is a folder; else FileNotFoundError naming it and what is there."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"No folder at {str(p)!r}: {_found(p)} is there; expected {what}.")
    return p


def read_text(path: str | os.PathLike[str], what: str, *, empty: bool = False) -> str:
    """The UTF-8 text of the file at ``path``.

    Raises:
        FileNotFoundError: no file at ``path`` (nothing, or a folder: the message says which).
        UnreadableFileError: the file is not UTF-8 text (another kind of file, random bytes), or holds nothing but
            white space and ``empty`` is False; the message names the file, what it holds and ``what`` was expected.
    """
    p = existing_file(path, what)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableFileError(f"{str(p)!r} is not a text file: byte 0x{data[error.start]:02x} at offset "
                                  f"{error.start} is not UTF-8 (it starts with {data[:8]!r}, {len(data):,} bytes); "
                                  f"expected {what}.") from None
    if not empty and not text.strip():
        raise UnreadableFileError(f"{str(p)!r} is empty ({len(data)} bytes{', all white space' if data else ''}); "
                                  f"expected {what}.")
    return text


def _create_temporary(directory: Path, name: str) -> tuple[int, Path]:
    """A new, empty temporary file beside ``name`` in ``directory``, opened for writing.

    ``os.open`` with mode 0o666 lets the kernel apply the umask (and default ACLs) exactly as
    for any file a program creates; ``O_EXCL`` keeps the name ours.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = directory / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def _unwritable(target: Path, reason: str) -> UnwritablePathError:
    return UnwritablePathError(f"Cannot write {str(target)!r}: {reason}. Choose a path you can write to.")


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Raises :class:`UnwritablePathError` unless a file can be written at ``path``; returns it.

    Tries what :func:`atomic_write` will do (create a file in the directory, or the missing
    directories' first existing parent), so a read-only file system or a directory without
    permission is found before any long work, and the message names ``path``, not a temporary.

    Example:
        >>> check_writable("/sys/model.tflite")      # doctest: +SKIP
        Traceback (most recent call last):
        UnwritablePathError: Cannot write '/sys/model.tflite': permission denied in '/sys'. ...
    """
    target = Path(path)
    if target.is_dir():
        raise _unwritable(target, "it is a directory; give a file name")
    if target.exists() and not os.access(target, os.W_OK):
        raise _unwritable(target, "the file is read-only")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise _unwritable(target, f"{str(parent)!r} is a file, not a directory")
    try:
        fd, tmp = _create_temporary(parent, target.name)
    except OSError as exc:
        raise _unwritable(target, f"{(exc.strerror or str(exc)).lower()} in {str(parent)!r}") from exc
    os.close(fd)
    os.unlink(tmp)
    return target


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Opens a temporary file beside ``path``; renames it onto ``path`` only on success.

    If the block raises, the target keeps its previous content and no temporary file is left.
    A destination that cannot be written raises :class:`UnwritablePathError` naming ``path``.

    Example:
        >>> import os
        >>> from pathlib import Path
        >>> with atomic_write("out/metrics.csv") as f:
        ...     _ = f.write("round,accuracy\\n")
        >>> print(Path("out/metrics.csv").read_text(), end="")
        round,accuracy
        >>> try:
        ...     with atomic_write("out/metrics.csv") as f:
        ...         _ = f.write("half a line")
        ...         raise RuntimeError("interrupted")
        ... except RuntimeError:
        ...     pass
        >>> print(Path("out/metrics.csv").read_text(), end="")
        round,accuracy
        >>> os.listdir("out")
        ['metrics.csv']
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write supports mode 'w' or 'wb'. Received: mode={mode!r}")
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(target.parent, target.name)
    except OSError as exc:
        check_writable(target)  # names the cause and the user's path
        raise _unwritable(target, exc.strerror or str(exc)) from exc
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.replace(tmp, target)
        except OSError as exc:  # e.g. the target is a directory
            check_writable(target)
            raise _unwritable(target, (exc.strerror or str(exc)).lower()) from exc
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_write(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    with atomic_write(path, "w") as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]  # (numpy is a dependency; kept for a bare interpreter)
    if np is not None:
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Saves a matplotlib figure as PNG atomically and closes it."""
    import matplotlib.pyplot as plt

    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def check_out_dir(name: str, value: Any, *, probe: str = "metrics.json") -> Path | None:
    """``value`` as a Path when a run can write its files there (None passes); else ValueError naming it.

    Writing is tried as :func:`check_writable` tries it, for a file named ``probe`` in the directory.

    Example:
        >>> from pathlib import Path
        >>> _ = Path("notes.txt").write_text("")
        >>> check_out_dir("out_dir", "notes.txt")
        Traceback (most recent call last):
        ValueError: out_dir must be a directory; 'notes.txt' is a file. Received: out_dir='notes.txt'
    """
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{name} must be a directory path. Received: {name}={value!r}")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} must be a directory; {str(path)!r} is a file. Received: {name}={str(value)!r}")
    try:
        check_writable(path / probe)
    except UnwritablePathError as err:
        raise ValueError(f"{name} cannot hold the run's files: {err} Received: {name}={str(value)!r}") from None
    return path


def unique_keys_loader() -> Any:
    """PyYAML's SafeLoader refusing a key given twice in one mapping (SafeLoader keeps the last one silently).

    The error is a ``yaml.constructor.ConstructorError`` whose problem names the key and both lines.
    """
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            # The mapping's own keys only: a merge key (<<: *anchor) brings keys that its own may override.
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    line = first.get(key)
                except TypeError:  # an unhashable key: the constructor below names it
                    continue
                if line is not None:  # on another line or the same one ({a: 1, a: 2})
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (first at line {line})", key_node.start_mark)
                first[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader
