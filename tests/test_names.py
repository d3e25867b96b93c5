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
    memory = estimate(tfl.models.build("digits_mlp", keras="tf_keras"), batch_size=8)  # the memory model reads Keras 2
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


# One word per concept (docs/glossary.md): a public parameter uses the word, never the concept's other names.
GLOSSARY = {
    "out_dir": ("out", "output", "output_dir", "outdir", "directory", "logdir", "log_dir", "base_dir"),
    "data_dir": (),          # the folder a dataset is read from (refused names: as out_dir's)
    "base_path": (),         # TF Serving's folder of a model's numbered versions
    "log": ("sink",),        # where progress lines go: a callable taking one line (None: nowhere)
    "progress": ("quiet",),  # verbosity has one polarity: progress=True / verbose=True say more, never quiet
    "arena_bytes": ("arena_size",),
    "resume": ("fresh",),    # None: continue if there is something to continue, True: must, False: begin again
}
REFUSED = {old: word for word, olds in GLOSSARY.items() for old in olds}

# Rooms not renamed yet: a path prefix each (issue 39 item 4). Take a room off this list and the test below lists
# what it still has.
NOT_YET_RENAMED: tuple[str, ...] = ()
# Another library's own word where tensorfleet mirrors its API (Keras Tuner's Tuner(directory=...)).
OTHER_LIBRARIES = {("tensorfleet/compat/keras_tuner.py", "set_project_dir", "directory")}
# A refused word that means something else here, not the concept the glossary gives it: launch's ``output`` is a
# TaskOutput (where the tasks' lines go and how they are shown), not a folder.
OTHER_MEANINGS = {("tensorfleet/cluster/launcher.py", "launch", "output")}


def _hidden_flag(default: ast.expr | None) -> bool:
    """A deprecated command-line flag kept hidden for one release (``typer.Option(..., hidden=True)``)."""
    return isinstance(default, ast.Call) and any(
        k.arg == "hidden" and isinstance(k.value, ast.Constant) and k.value.value is True for k in default.keywords)


def _public_parameters():
    """(module path, function, parameter, default) of every public function, of the methods and fields of
    public classes (module-level annotated names are not in it: they sit outside any class)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if any(part.startswith("_") and part != "__init__.py" for part in parts):
            continue
        where = str(path.relative_to(PACKAGE.parent))
        stack = [(node, False, False) for node in ast.parse(path.read_text(), where).body]
        while stack:
            node, private, in_class = stack.pop()
            if isinstance(node, ast.ClassDef):
                stack.extend((child, private or node.name.startswith("_"), True) for child in node.body)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and in_class and not private:
                yield where, "(a field)", node.target.id, node.value  # a dataclass's field is its parameter
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not private \
                    and (node.name == "__init__" or not node.name.startswith("_")):
                args = node.args
                positional = args.posonlyargs + args.args
                defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
                for arg, default in [*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
                    yield where, node.name, arg.arg, default


def test_public_parameters_use_the_glossarys_words():
    seen, wrong = set(), []
    for where, function, name, default in _public_parameters():
        seen.add(name)
        if name in REFUSED and not where.startswith(NOT_YET_RENAMED) and not _hidden_flag(default) \
                and (where, function, name) not in OTHER_LIBRARIES | OTHER_MEANINGS:
            wrong.append(f"{where} {function}({name}=...): say {REFUSED[name]}")
    assert {"out_dir", "log", "progress", "arena_bytes", "resume", "data_dir", "base_path"} <= seen  # it reads them
    assert wrong == [], "\n".join(wrong)


def test_the_glossary_page_defines_each_word():
    text = (PACKAGE.parent / "docs" / "glossary.md").read_text()
    for word, olds in GLOSSARY.items():
        assert f"`{word}`" in text, word
        for old in olds:
            assert f"`{old}`" in text, f"the glossary names {old!r} as the older word for {word!r}"
