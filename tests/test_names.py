"""Each public name keeps one meaning across the package (read from the syntax tree of every module):

- ``describe`` (a function or a method) returns a human-readable ``str``; never a dict or list.
- ``as_dict`` returns a JSON-ready ``dict``; there is no ``to_dict``.
- a function that lists a registry's entries as dicts is named for what it returns (``catalogue``).
- models are named for what they take: the 8x8 digits models are ``digits_*``; no name says MNIST.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensorfleet"


def _functions() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(ast.parse(path.read_text(), where)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{where}:{node.lineno}", node))
    return found


FUNCTIONS = _functions()


def _returns(node: ast.FunctionDef) -> str:
    return ast.unparse(node.returns) if node.returns is not None else "(no annotation)"


@pytest.mark.parametrize("name,returns", [("describe", ("str",)), ("as_dict", ("dict",)),
                                          ("catalogue", ("list[dict",))])
def test_each_name_returns_one_kind_of_thing(name, returns):
    assert any(node.name == name for _, node in FUNCTIONS), name  # the check reads something
    wrong = [f"{where} {name}() -> {_returns(node)}" for where, node in FUNCTIONS
             if node.name == name and not _returns(node).startswith(returns)]
    assert wrong == [], f"{name}() must return {returns[0]}...: {wrong}"


def test_there_is_no_to_dict():
    assert [where for where, node in FUNCTIONS if node.name == "to_dict"] == []


def test_describe_and_as_dict_return_what_they_say_when_called():
    import tensorfleet as tfl
    from tensorfleet.planner.memory import estimate

    assert tfl.models.describe("digits_cnn").startswith("Small CNN for 8x8 digits")
    assert tfl.strategies.describe("mirrored").startswith("mirrored")
    memory = estimate(tfl.models.build("digits_mlp"), batch_size=8)
    assert isinstance(memory.as_dict(), dict) and memory.as_dict()["total"] == memory.total


def test_models_are_named_for_what_they_take():
    import tensorfleet as tfl
    from tensorfleet.models import MODELS

    names = {name for entry in MODELS.entries() for name in (entry.name, *entry.aliases)}
    assert not [n for n in names if "mnist" in n.lower()], names
    assert tfl.models.build("digits_cnn").input_shape == (None, 8, 8, 1)
    assert tfl.models.build("digits_mlp").input_shape == (None, 64)
    with pytest.raises(ValueError, match=r"^Unknown model 'mnist_cnn'\. .*Available: digits_cnn, digits_mlp, "):
        tfl.models.build("mnist_cnn")  # the alias is retired
