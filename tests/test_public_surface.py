"""The public surface is what each room's ``__init__`` exports (docs/architecture.md, "The public surface").

Held here: every exported name resolves; each room's ``if TYPE_CHECKING:`` imports (what editors and type
checkers read) are exactly the names its lazy map serves; the reference documents exactly the exported
names; and the docs' code blocks, the README's and the examples import only public names, never a
room's module (``tensorfleet.federated.backends.compiled.workers``): a module may move, a name stays.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tensorfleet"
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import codeblocks  # noqa: E402
import reference  # noqa: E402

sys.path.pop(0)

# The rooms users import from (tensorfleet/__init__.py serves them); cli is the command, its __all__ is empty.
ROOMS = ("strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", "serving",
         "tuning", "profiling")

# Deep references made on purpose (where the page or script, the reference as written): keep this tiny.
EXTENSION_POINTS: set[str] = set()


def _exports(room: str) -> list[str]:
    return list(importlib.import_module(f"tensorfleet.{room}").__all__)


def _is_module(room: str, name: str) -> bool:
    return isinstance(getattr(importlib.import_module(f"tensorfleet.{room}"), name, None), types.ModuleType)


def _lazy_and_typed(source: str) -> tuple[set[str], set[str]]:
    """(the public names an ``attach`` call serves, the names imported under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(source)
    lazy: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "attach":
            for keyword in node.keywords:  # internal= modules are served too, but are not the surface
                if keyword.arg == "modules":
                    lazy |= {e.value for e in keyword.value.elts}
                elif keyword.arg == "names":
                    lazy |= {k.value for k in keyword.value.keys}
    typed = {a.asname or a.name for node in tree.body
             if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
             for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names}
    return lazy, typed


@pytest.mark.parametrize("room", ["", *ROOMS])
def test_a_rooms_type_checking_imports_are_its_lazy_names(room: str) -> None:
    path = PACKAGE / room / "__init__.py"
    lazy, typed = _lazy_and_typed(path.read_text())
    # Served lazily and unknown to type checkers / imported for them but not served.
    assert (sorted(lazy - typed), sorted(typed - lazy)) == ([], []), path


def test_the_check_reads_a_lazy_map_and_its_type_checking_block() -> None:
    source = ("from typing import TYPE_CHECKING\nfrom tensorfleet.lazy import attach\n"
              "__getattr__, _L = attach(__name__, names={'plan': 'plans', 'est': 'memory:estimate'}, internal=('x',))\n"
              "if TYPE_CHECKING:\n    from p.plans import plan\n    from p.memory import estimate as est, other\n")
    assert _lazy_and_typed(source) == ({"plan", "est"}, {"plan", "est", "other"})


@pytest.mark.parametrize("room", ["", *ROOMS])
def test_every_exported_name_resolves(room: str) -> None:
    package = importlib.import_module(f"tensorfleet.{room}".rstrip("."))
    assert len(set(package.__all__)) == len(package.__all__), f"{room}.__all__ names one name twice"
    missing = [name for name in package.__all__ if getattr(package, name, None) is None]
    assert missing == []
    if room:  # a room exports names, not its modules (which are internal, and may move)
        assert [name for name in package.__all__ if _is_module(room, name)] == []
        # A submodule of a lazily served name's name would replace it on the package once imported.
        submodules = {info.name for info in pkgutil.iter_modules(package.__path__)}
        assert sorted(submodules & _lazy_and_typed((PACKAGE / room / "__init__.py").read_text())[0]) == []


@pytest.mark.slow
def test_importing_tensorfleet_and_its_rooms_loads_no_tensorflow() -> None:
    code = ("import sys, tensorfleet as tfl; rooms = [getattr(tfl, r) for r in tfl.__all__ if r != '__version__']; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == "[]", out.stderr[-2000:]


def test_the_reference_documents_each_exported_name_once() -> None:
    pages = reference.pages()
    documented = [line[4:].strip() for text in pages.values() for line in text.splitlines()
                  if line.startswith("::: ")]
    for room in ROOMS:
        names = {f"tensorfleet.{room}.{name}" for name in _exports(room) if not _is_module(room, name)}
        mine = {entry for entry in documented if entry.startswith(f"tensorfleet.{room}.")}
        assert sorted(names - mine) == [] and sorted(mine - names) == [], room
    assert len(documented) == len(set(documented))


_FROM = re.compile(r"\bfrom\s+tensorfleet((?:\.\w+)*)\s+import\s+(\([^)]*\)|[\w ,\\\n]+?)(?:$|;|#)", re.M)
_IMPORT = re.compile(r"\bimport\s+tensorfleet((?:\.\w+)+)")
_DOTTED = re.compile(r"(?<![\w.])(?:tensorfleet|tfl)((?:\.\w+)+)")


def _deep(room: str, name: str, exported: dict[str, set[str]]) -> bool:
    return name not in exported[room] or _is_module(room, name)


def deep_references(code: str) -> list[str]:
    """The references in ``code`` that reach past a room's exported names, as written."""
    exported = {room: set(_exports(room)) for room in ROOMS}
    found = []
    for match in _FROM.finditer(code):
        parts = match.group(1).lstrip(".").split(".") if match.group(1) else []
        names = [n.split(" as ")[0].strip() for n in re.split(r"[,\s]*,[,\s]*|\s*\\\s*", match.group(2).strip("() \n"))]
        if len(parts) == 1 and parts[0] in ROOMS:
            found += [f"from tensorfleet.{parts[0]} import {n}" for n in names if n and _deep(parts[0], n, exported)]
        elif len(parts) > 1 and parts[0] in ROOMS:
            found.append(f"from tensorfleet.{'.'.join(parts)} import ...")
    found += [f"import tensorfleet{m.group(1)}" for m in _IMPORT.finditer(code)
              if m.group(1).split(".")[1] in ROOMS and m.group(1).count(".") > 1]
    for match in _DOTTED.finditer(code):
        parts = match.group(1).lstrip(".").split(".")
        if len(parts) > 1 and parts[0] in ROOMS and _deep(parts[0], parts[1], exported):
            written = match.group(0)
            if not any(f.startswith(f"from {written} import") or f == f"import {written}" for f in found):
                found.append(written)
    return found


def _sources() -> dict[str, str]:
    """Where users read code: every fenced block of the docs' pages and the README, every example script."""
    texts = {}
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for block in codeblocks.blocks(page.read_text()):
            texts[f"{page.relative_to(ROOT)}:{block.line}"] = block.code
    for script in sorted((ROOT / "examples").rglob("*.py")):
        texts[str(script.relative_to(ROOT))] = script.read_text()
    return texts


def all_deep_references() -> list[str]:
    return [f"{where}: {ref}" for where, code in _sources().items() for ref in deep_references(code)
            if f"{where.split(':')[0]}: {ref}" not in EXTENSION_POINTS]


def test_the_scan_catches_deep_paths_and_passes_public_names() -> None:
    code = ("import tensorfleet as tfl\nfrom tensorfleet.federated.backends.compiled.workers import TfWorker\n"
            "from tensorfleet.models import datasets, build\nx = tfl.models.datasets.load_digits()\n"
            "sim = tfl.federated.Simulation\nimport tensorfleet.planner.memory\nfrom tensorfleet import edge\n"
            "a = tfl.edge.convert(m)\nfrom tensorfleet.cluster import (launch,\n    nope)\n")
    assert deep_references(code) == [
        "from tensorfleet.federated.backends.compiled.workers import ...", "from tensorfleet.models import datasets",
        "from tensorfleet.cluster import nope", "import tensorfleet.planner.memory", "tfl.models.datasets.load_digits"]


def test_docs_readme_and_examples_import_only_public_names() -> None:
    deep = all_deep_references()
    assert deep == [], f"{len(deep)} references past the public surface:\n" + "\n".join(deep)


if __name__ == "__main__":  # python tests/test_public_surface.py: the list, for whoever rewrites them
    print("\n".join(all_deep_references()))
