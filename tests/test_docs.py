"""Every code block on the tutorial and how-to pages runs, top to bottom, as a reader would run it.

Each page runs in a new Python process (a fresh TensorFlow, as a reader's script has) in a
temporary working directory: its ```python blocks in one namespace, its ```bash blocks in that
directory with the environment's ``bin`` first on PATH, blocks with a file name saved to that file
(``docs/hooks/codeblocks.py`` says how). A page marked ``<!-- docs-test: tff -->`` runs on the tff
track. The pictures a page lists are kept for the site's build, which then need not draw them again.

Most of a page's time is a new process importing TensorFlow, on one core: the pages selected for
the run are started two at a time (``TENSORFLEET_DOCS_PAGES_AT_ONCE``) when the first of them is
reached, and each page's test waits for its own.
"""

from __future__ import annotations

import os
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS / "hooks"))
import codeblocks  # noqa: E402

sys.path.pop(0)

PAGES = sorted([*DOCS.glob("tutorial-*.md"), *DOCS.glob("how-to-*.md")])


def _param(page: Path) -> object:
    marks = [pytest.mark.slow, pytest.mark.timeout(900)]
    if codeblocks.needs_tff(page):
        marks.append(pytest.mark.tff)
    return pytest.param(page, id=page.stem, marks=marks)


def test_the_runner_reads_blocks_as_a_reader_does() -> None:
    text = ("```python\nx = 1\n```\n\n```text\nout\n```\n\n```bash\necho hi\n```\n\n"
            '```python title="train.py"\nprint(2)\n```\n\n  ```yaml\n  a: 1\n  ```\n')
    found = codeblocks.blocks(text)
    assert [(b.language, b.title, b.runs) for b in found] == [
        ("python", None, True), ("text", None, False), ("bash", None, True), ("python", "train.py", False),
        ("yaml", None, False)]
    assert found[0].code == "x = 1\n" and found[4].code == "a: 1\n" and found[2].line == 9


@pytest.mark.slow
def test_a_failing_block_fails_its_page(tmp_path: Path) -> None:
    page = tmp_path / "how-to-fail.md"
    page.write_text('```text title="given.txt"\n41\n```\n\n```python\nvalue = 41\n```\n\n'
                    '```bash\ntest "$(cat given.txt)" = 42\n```\n')
    (tmp_path / "work").mkdir()
    done = codeblocks.run_page_in_process(page, tmp_path / "work", timeout=120)
    assert done.returncode != 0
    assert "how-to-fail.md, the block at line 9: the bash block exited with status 1" in done.stderr


def test_tutorials_and_how_tos_show_no_code_that_does_not_run() -> None:
    sketches = [f"{page.name}:{block.line}" for page in PAGES for block in codeblocks.blocks(page.read_text())
                if block.language in ("py", "python3", "sh", "shell", "console")]
    assert sketches == [], "blocks the runner skips (use python/bash, or text for output)"


def _run(page: Path, workdir: Path) -> tuple[Path, object]:
    return workdir, codeblocks.run_page_in_process(page, workdir, timeout=880)


@pytest.fixture(scope="module")
def page_runs(request: pytest.FixtureRequest):
    """The selected pages' runs, started at most two at a time; page -> Future of (workdir, result)."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_every_block_of_the_page_runs"]
    at_once = int(os.environ.get("TENSORFLEET_DOCS_PAGES_AT_ONCE", "2"))
    with tempfile.TemporaryDirectory(prefix="tensorfleet-docs-") as scratch, \
            ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
        runs: dict[Path, Future] = {}
        for i, page in enumerate(selected):
            workdir = Path(scratch) / f"{i}-{page.stem}"
            workdir.mkdir()
            runs[page] = pool.submit(_run, page, workdir)
        yield runs
        for future in runs.values():
            future.cancel()


@pytest.mark.parametrize("page", [_param(page) for page in PAGES])
def test_every_block_of_the_page_runs(page: Path, page_runs) -> None:
    workdir, done = page_runs[page].result()
    assert done.returncode == 0, f"{page.name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert f"ran every block of {page.name}" in done.stdout
    codeblocks.keep_pictures(page, workdir)
