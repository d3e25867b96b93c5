"""The package's layout rules, read from the source: which room may import which, unique public
class names, no private name reached across modules, and the size of modules and functions.

Imports are read with ``ast`` (every ``import``, also the lazy ones inside functions), so a rule
broken anywhere in a module fails here, not only at import time.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensorfleet"
CORE = {"io", "registry", "validation", "netbind", "kube", "lazy"}

# room -> rooms it must not import (docs/architecture.md, "Import rules").
NEW_ROOMS = {"serving", "tuning", "profiling"}  # the rooms that serve, tune and profile what the others train
# The tests' and benchmarks' hooks stand above the library: no library room imports tensorfleet.testing, except
# its hook points (HOOK_POINTS), a module of settings that imports no tensorfleet module itself.
TESTING = "testing"
HOOK_POINTS = {"tensorfleet.testing.hooks"}
FORBIDDEN = {
    "models": {"strategies", "model_parallel", "cluster", "planner", "federated", "edge", "cli", "demo", TESTING,
               *NEW_ROOMS},
    "edge": {"federated", "strategies", "model_parallel", "cluster", "planner", "cli", TESTING, *NEW_ROOMS},
    "strategies": {"federated", "edge", "cluster", "planner", "model_parallel", "cli", TESTING, *NEW_ROOMS},
    "federated": {"strategies", "model_parallel", "cluster", "planner", "edge", "cli", TESTING, *NEW_ROOMS},
    **{room: {"cli", "demo", TESTING, *NEW_ROOMS} for room in ("cluster", "planner")},
    "model_parallel": {"planner", "cli", "demo", TESTING, *NEW_ROOMS},  # the planner plans, and runs on the mesh
    # Each new room stands on the training rooms and the core; none imports another new room.
    "serving": {"federated", "edge", "cli", "demo", "tuning", "profiling", TESTING},
    "tuning": {"federated", "edge", "cli", "demo", "serving", "profiling", TESTING},
    "profiling": {"federated", "edge", "model_parallel", "cluster", "cli", "demo", "serving", "tuning", TESTING},
    **{core: {"strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", "cli", "demo",
              TESTING, *NEW_ROOMS}
       for core in CORE},
    # The seam to other libraries' internals stands below every room, as the core does: any room may use it.
    "compat": {"strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", "cli", "demo",
               TESTING, *NEW_ROOMS},
    # The hooks drive the library from above, as a test does.
    TESTING: {"cli", "demo"},
}
LIBRARY_ROOMS = {"strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", *NEW_ROOMS,
                 *CORE}
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p for p in sorted(PACKAGE.rglob("*.py"))}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: -node.level]  # a package's own module is named "<package>.__init__"
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, source: str) -> list[tuple[str, list[str], int]]:
    """(imported tensorfleet module, names taken from it, line) for every import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "tensorfleet"]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target.split(".")[0] == "tensorfleet":
                names = [a.name for a in node.names]
                if target == "tensorfleet":  # "from tensorfleet import edge" names the room itself
                    found += [(f"tensorfleet.{n}", [], node.lineno) for n in names]
                else:
                    found.append((target, names, node.lineno))
    return found


def layout_violations(sources: dict[str, str]) -> list[str]:
    """Every broken import rule in ``sources`` (module name -> its text), one line each."""
    problems = []
    for module, source in sources.items():
        room = _room(module)
        for target, names, line in imports_of(module, source):
            other = _room(target)
            if module in HOOK_POINTS:
                problems.append(f"{module}:{line} imports {target} (the hook points import no tensorfleet module)")
            elif other and other != room and other in FORBIDDEN.get(room, set()) and target not in HOOK_POINTS:
                problems.append(f"{module}:{line} imports {target} ({room} must not import {other})")
            elif other == "cli" and room in LIBRARY_ROOMS:
                problems.append(f"{module}:{line} imports {target} (no library module imports cli)")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target != module:
                problems.append(f"{module}:{line} imports private {', '.join(private)} from {target}")
    return problems


def test_the_rules_catch_a_forbidden_and_a_private_import():
    planted = {
        "tensorfleet.edge.convert": "def f():\n    from tensorfleet.federated import Simulation\n",
        "tensorfleet.models.zoo": "from tensorfleet.strategies.registry import build\n",
        "tensorfleet.io": "import tensorfleet.cli.main\n",
        "tensorfleet.strategies.registry": "from tensorfleet import planner\n",
        "tensorfleet.federated.simulation": "from tensorfleet.federated.backends.tff import _GRPC\n",
        "tensorfleet.cluster.launcher": "from tensorfleet.strategies.tf_config import ClusterSpec\n",
        "tensorfleet.compat.distribute": "from tensorfleet.strategies.inputs import uses_coordinator\n",
        "tensorfleet.cluster.elastic": "from tensorfleet.testing.hooks import active\nfrom tensorfleet.testing import "
                                       "Fault\n",
        "tensorfleet.testing.hooks": "from tensorfleet.validation import number\n",
    }
    assert layout_violations(planted) == [
        "tensorfleet.edge.convert:2 imports tensorfleet.federated (edge must not import federated)",
        "tensorfleet.models.zoo:1 imports tensorfleet.strategies.registry (models must not import strategies)",
        "tensorfleet.io:1 imports tensorfleet.cli.main (io must not import cli)",
        "tensorfleet.strategies.registry:1 imports tensorfleet.planner (strategies must not import planner)",
        "tensorfleet.federated.simulation:1 imports private _GRPC from tensorfleet.federated.backends.tff",
        "tensorfleet.compat.distribute:1 imports tensorfleet.strategies.inputs (compat must not import strategies)",
        "tensorfleet.cluster.elastic:2 imports tensorfleet.testing (cluster must not import testing)",
        "tensorfleet.testing.hooks:1 imports tensorfleet.validation (the hook points import no tensorfleet module)",
    ]


def test_every_module_keeps_the_import_rules():
    sources = {name: path.read_text() for name, path in _modules().items()}
    assert layout_violations(sources) == []


def test_every_room_of_the_design_exists_with_a_docstring():
    for room in ("strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", "cli",
                 *sorted(NEW_ROOMS)):
        init = PACKAGE / room / "__init__.py"
        assert init.exists(), room
        assert ast.get_docstring(ast.parse(init.read_text())), f"{room}/__init__.py has no docstring"


def test_public_class_names_are_unique_across_the_package():
    where = defaultdict(list)
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(name)
    assert {cls: mods for cls, mods in where.items() if len(mods) > 1} == {}


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring does not count
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


@pytest.mark.parametrize("limit_kind", ["module", "function"])
def test_modules_and_functions_stay_small(limit_kind):
    over = []
    for name, path in _modules().items():
        source = path.read_text()
        if limit_kind == "module" and source.count("\n") > MAX_MODULE_LINES:
            over.append(f"{name} ({source.count(chr(10))} lines)")
        if limit_kind == "function":
            over += [f"{name}.{f.name} ({_body_lines(f)} lines)" for f in ast.walk(ast.parse(source))
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(f) > MAX_FUNCTION_LINES]
    assert over == []


def test_the_architecture_page_states_the_import_rules_this_test_holds():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = page.split("## Import rules", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    stated: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        rooms, forbidden = (cell.strip() for cell in row.strip("|").split("|"))
        if rooms == "`compat` and the core":
            assert forbidden == "every room, `cli` and `demo`"
            everything = {"cli", "demo", *(set(FORBIDDEN) - CORE - {"compat"})}
            stated.update({name: everything for name in ("compat", *CORE)})
            continue
        for room in rooms.replace("`", "").split(", "):
            stated[room] = set(forbidden.split(", "))
    assert stated == {room: set(rule) for room, rule in FORBIDDEN.items()}
