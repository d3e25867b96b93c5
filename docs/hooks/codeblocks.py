"""Runs the code of a docs page as a reader would, top to bottom, in a working directory of its own.

Shared by the test suite (``tests/test_docs.py``: every tutorial-* and how-to-* page) and the site
build (``docs/hooks/pictures.py``: the pages that draw the site's pictures). A page's fenced blocks,
in order:

- ```` ```python ```` blocks run in one namespace, in one Python process (the interpreter running
  this module), as one script would;
- ```` ```bash ```` blocks run with ``bash -euo pipefail`` in the same directory, with the
  interpreter's ``bin`` first on ``PATH`` (so ``tensorfleet`` and ``python`` are the project's);
- a block with a file name (```` ```python title="train.py" ````, also ``yaml``, ``json``, ``text``)
  is written to that file instead of run: the reader saves it, a later block uses it;
- ```` ```text ```` blocks (output) and any other language are not run; ```` ```py ```` marks a
  sketch on an explanation page (highlighted as Python, not run; the tutorial and how-to pages have
  none, which ``tests/test_docs.py`` checks).

Run a page by hand: ``python docs/hooks/codeblocks.py docs/tutorial-federated-from-a-script.md [DIR]``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                    re.S | re.M)
_TITLE = re.compile(r'title="([^"]+)"')
RUN_LANGUAGES = ("python", "bash")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, the file it is saved as (if any), its code, its line."""

    language: str
    title: str | None
    code: str
    line: int

    @property
    def runs(self) -> bool:
        return self.title is None and self.language in RUN_LANGUAGES


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    found = []
    for match in _FENCE.finditer(text):
        info = match.group("info").strip()
        language = info.split()[0].lstrip(".{") if info else ""
        title = _TITLE.search(info)
        indent = match.group("indent")
        code = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match.group("body").splitlines(keepends=True))
        found.append(Block(language, title.group(1) if title else None, code, text.count("\n", 0, match.start()) + 1))
    return found


def _environment() -> dict[str, str]:
    # A reader's process: tf.keras is what TensorFlow makes it (Keras 3 on 2.21), not the test suite's tf_keras.
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def run_page(page: str | os.PathLike[str], workdir: str | os.PathLike[str]) -> None:
    """Runs ``page``'s blocks in ``workdir`` (see the module's docstring); raises on the first failure,
    naming the page and the block's line."""
    page = Path(page).resolve()
    os.chdir(workdir)
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in blocks(page.read_text()):
        where = f"{page.name}, the block at line {block.line}"
        if block.title is not None:
            Path(block.title).parent.mkdir(parents=True, exist_ok=True)
            Path(block.title).write_text(block.code)
        elif block.language == "python":
            print(f"--- {where} (python)", flush=True)
            exec(compile(block.code, f"<{where}>", "exec"), namespace)  # noqa: S102 - the page's own code
        elif block.language == "bash":
            print(f"--- {where} (bash)", flush=True)
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], env=_environment(), check=False)
            if done.returncode:
                raise RuntimeError(f"{where}: the bash block exited with status {done.returncode}")


def run_page_in_process(page: str | os.PathLike[str], workdir: str | os.PathLike[str], *,
                        timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs ``page`` in a new Python process (a fresh TensorFlow, as a reader's); returns what it printed."""
    return subprocess.run([sys.executable, __file__, str(Path(page).resolve()), str(workdir)], env=_environment(),
                          capture_output=True, text=True, timeout=timeout, check=False)


_PICTURES = re.compile(r"<!--\s*pictures:(.*?)-->", re.S)
_TRACK = re.compile(r"<!--\s*docs-test:\s*tff\s*-->")
CACHE = Path(tempfile.gettempdir()) / "tensorfleet-docs-pictures"


def pictures(page: str | os.PathLike[str]) -> list[str]:
    """The files a page's code draws and the site shows, as the page lists them in a
    ``<!-- pictures: runs/a/accuracy.png ... -->`` comment (paths in the page's working directory).
    The page shows each as ``img/<page name>/<file name>``."""
    match = _PICTURES.search(Path(page).read_text())
    return match.group(1).split() if match else []


def needs_tff(page: str | os.PathLike[str]) -> bool:
    """Whether the page's code runs on the tff track (it says ``<!-- docs-test: tff -->``)."""
    return bool(_TRACK.search(Path(page).read_text()))


def cache_dir(page: str | os.PathLike[str]) -> Path:
    """Where the pictures of this version of the page's code are kept (keyed by the code and the
    package's source, so a change to either draws them again)."""
    digest = hashlib.sha256()
    for block in blocks(Path(page).read_text()):
        digest.update(f"{block.language}:{block.title}:{block.code}".encode())
    package = Path(__file__).resolve().parents[2] / "tensorfleet"
    for path in sorted(package.rglob("*.py")):
        digest.update(path.read_bytes())
    return CACHE / Path(page).stem / digest.hexdigest()[:20]


def cached_pictures(page: str | os.PathLike[str]) -> list[Path] | None:
    """The page's pictures from an earlier run of this code, or None when one is missing."""
    found = [cache_dir(page) / Path(name).name for name in pictures(page)]
    return found if all(path.is_file() for path in found) else None


def keep_pictures(page: str | os.PathLike[str], workdir: str | os.PathLike[str]) -> list[Path]:
    """Copies the pictures a run of the page drew in ``workdir`` to the cache; a missing one is an error."""
    target = cache_dir(page)
    target.mkdir(parents=True, exist_ok=True)
    kept = []
    for name in pictures(page):
        source = Path(workdir) / name
        if not source.is_file():
            raise FileNotFoundError(f"{Path(page).name} lists the picture {name!r}, which its code did not draw "
                                    f"(looked in {workdir})")
        shutil.copyfile(source, target / source.name)
        kept.append(target / source.name)
    return kept


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print("usage: python docs/hooks/codeblocks.py PAGE.md [WORKDIR]", file=sys.stderr)
        return 2
    workdir = argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="tensorfleet-docs-")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    run_page(argv[0], workdir)
    print(f"--- ran every block of {Path(argv[0]).name} in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
