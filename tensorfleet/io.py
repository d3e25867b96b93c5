"""Atomic file writing: nothing half-written is ever left behind.

Every file tensorfleet writes (checkpoints, metrics, plots, C sources, manifests) goes
through :func:`atomic_write` or one of its helpers: the data goes to a temporary file in the
same directory, is flushed and fsynced, then renamed over the target.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

__all__ = ["atomic_write", "write_bytes", "write_text", "write_json", "save_figure"]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Opens a temporary file beside ``path``; renames it onto ``path`` only on success.

    If the block raises, the target keeps its previous content and no temporary file is left.

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
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
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
        np = None
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
