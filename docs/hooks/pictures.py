"""A mkdocs hook: the pictures on the site are drawn by the pages' own code when the site is built.

A page lists what its code draws in a ``<!-- pictures: runs/a/accuracy.png ... -->`` comment and
shows each as ``img/<page name>/<file name>``. Before the pages are read, this hook runs every such
page's code (``docs/hooks/codeblocks.py``, in a new process and a temporary directory) unless the
pictures of the same code and package source are already kept (the test suite keeps them when it
runs the page), and adds the pictures to the site. A page whose code fails, or does not draw what it
lists, fails the build with what the code printed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import codeblocks  # noqa: E402

sys.path.pop(0)


def _draw(page: Path) -> list[Path]:
    found = codeblocks.cached_pictures(page)
    if found is not None:
        return found
    from mkdocs.exceptions import PluginError

    with tempfile.TemporaryDirectory(prefix="tensorfleet-docs-") as workdir:
        done = codeblocks.run_page_in_process(page, workdir, timeout=900)
        if done.returncode:
            raise PluginError(f"{page.name}: its code failed, so its pictures cannot be drawn:\n"
                              f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return codeblocks.keep_pictures(page, workdir)


def on_files(files, config):
    """Adds each page's pictures as ``img/<page>/<file>``, drawing those not drawn yet."""
    from mkdocs.structure.files import File

    for page in sorted(Path(config["docs_dir"]).glob("*.md")):
        if not codeblocks.pictures(page) or codeblocks.needs_tff(page):
            continue
        for picture in _draw(page):
            files.append(File.generated(config, f"img/{page.stem}/{picture.name}", abs_src_path=str(picture)))
    return files
