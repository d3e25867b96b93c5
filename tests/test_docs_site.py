"""The site's sources: the README's size and links, and the build's conversion of docstrings.

The site itself is built by ``make test`` (``mkdocs build --strict``: no broken link, no missing
reference); these checks are the quick ones that need no build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

# The site is built on the current track only (the docs tools are not in the tff track's lock).
pytest.importorskip("griffe", reason="the docs site's tools are on the current track (make docs)")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import griffe_docstrings  # noqa: E402
import reference  # noqa: E402

sys.path.pop(0)


def test_the_readme_is_at_most_15_kb() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 15 * 1024


def test_every_link_of_the_readme_reaches_a_file() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the site"
    assert [link for link in local if not (ROOT / link).is_file()] == []


def test_docstrings_read_as_markdown() -> None:
    text = ("Returns ``d[0][1]`` of :class:`~tensorfleet.io.Thing` as [data replica][model shard].\n\n"
            "Args:\n    workers, max_trials,\n        seed: see it.\n\n"
            "Example:\n    >>> d = {'a': [1]}\n    >>> d['a'][0]\n    1\n\n    After.\n")
    assert griffe_docstrings.markdown(text) == (
        "Returns `d[0][1]` of `tensorfleet.io.Thing` as \\[data replica\\]\\[model shard\\].\n\n"
        "Args:\n    workers, max_trials, seed: see it.\n\n"
        "Example:\n    ```pycon\n    >>> d = {'a': [1]}\n    >>> d['a'][0]\n    1\n    ```\n\n    After.")


def test_the_reference_documents_what_the_rooms_export_not_their_modules() -> None:
    pages = reference.pages()
    documented = {line[4:] for text in pages.values() for line in text.splitlines() if line.startswith("::: ")}
    assert {"tensorfleet.strategies.build", "tensorfleet.federated.Simulation", "tensorfleet.edge.validate_micro",
            "tensorfleet.federated.TfWorker"} <= documented
    assert not documented & {"tensorfleet.strategies.registry", "tensorfleet.federated.simulation",
                             "tensorfleet.federated.backends.compiled.workers", "tensorfleet.compat.keras"}
    assert not any("._" in name for name in documented)
    assert "ref-cli.md" not in pages  # the command's page is mkdocs-click's


def test_the_yaml_reference_lists_every_key_with_its_flag_and_help_from_the_declaration() -> None:
    from tensorfleet.federated.experiment import KEYS, OPTIONS

    table = reference.yaml_keys_table()
    rows = {row.split("`")[1]: row for row in table.splitlines()[2:]}
    assert list(rows) == list(KEYS)
    assert "| `rounds` | `10` | `--rounds` |" in table
    for name, info in OPTIONS.items():
        assert f"`{info.flag}`" in rows[name] and info.help.replace("|", "\\|") in rows[name], name


def test_word_indexes_in_pages_are_text_and_references_stay_links() -> None:
    page = ("a [data replica][model shard] b `x[a][b c]`\n```\n[p][q r]\n```\n"
            "[t][u v]\n\n[u v]: https://example.org\n[k][tensorfleet.io]\n")
    assert reference.prose_brackets(page) == page.replace("[data replica][model shard]",
                                                          "\\[data replica\\]\\[model shard\\]")
