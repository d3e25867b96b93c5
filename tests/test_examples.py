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


def _modules() -> list[str]:
    names = ["tensorfleet"]
    for info in pkgutil.walk_packages(tensorfleet.__path__, prefix="tensorfleet."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run_as_shown(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, name) if t.examples and t.filename == module.__file__]
    if not tests:
        pytest.skip(f"{name} has no examples")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list[str] = []
    out = failures.append
    for test in tests:
        runner.run(test, out=out)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(failures)
