"""Every ``Example`` block in the package's docstrings runs and prints what it shows.

Examples are doctests: each module's run in a fresh temporary directory (so files they write
land there), with the suite's 4 logical CPU devices. An example that cannot run here (it needs
a cluster, a TPU or a server of its own) says so with ``# doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tensorfleet


def _examples(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, name) if t.examples and t.filename == module.__file__]


def _modules_with_examples() -> list[str]:
    names = ["tensorfleet"] + [info.name for info in pkgutil.walk_packages(tensorfleet.__path__, prefix="tensorfleet.")]
    return sorted(name for name in names if not name.endswith("__main__") and _examples(name))


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples_run_as_shown(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list[str] = []
    for test in _examples(name):
        runner.run(test, out=failures.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(failures)


def test_the_public_entry_points_have_examples():
    # The modules users start from; a module that loses all its examples drops out of the test above.
    for name in ("tensorfleet.strategies.data_parallel", "tensorfleet.strategies.registry",
                 "tensorfleet.federated.simulation", "tensorfleet.edge.convert", "tensorfleet.planner.plans"):
        assert _examples(name), f"{name} has no docstring examples"
