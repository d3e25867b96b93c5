"""Every ``Example`` block in the package's docstrings runs and prints what it shows.

Examples are doctests: each module's run in a fresh temporary directory (so files they write
land there), with the suite's 4 logical CPU devices. An example that cannot run here (it needs
a cluster, a TPU or a server of its own) says so with ``# doctest: +SKIP``.

A docstring whose examples use tensorflow-federated (they name ``tff`` or ``tensorflow_federated``,
or are those of TFF's worker process and remote workers, :data:`TFF_MODULES`) needs the tff track: a module's examples
are run as two tests, those without TFF (every track) and those with it (marked ``tff``). Every module imports without
TFF, so collection needs none.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re

import pytest

import tensorfleet

# What a docstring's examples name when they need TFF.
_NEEDS_TFF = re.compile(r"\btff\b|tensorflow_federated")
# Modules whose every example needs TFF without naming it: TFF's worker process and the remote workers.
TFF_MODULES = tuple(f"tensorfleet.federated.backends.{m}" for m in ("tff", "worker", "remote", "remote_executors"))


def _needs_tff(test: doctest.DocTest) -> bool:
    return test.name.startswith(TFF_MODULES) or any(_NEEDS_TFF.search(example.source) for example in test.examples)


def _examples(name: str, tff: bool | None = None) -> list[doctest.DocTest]:
    """The module's doctests (those that need TFF when ``tff`` is True, those that do not when False)."""
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, name) if t.examples and t.filename == module.__file__]
    return tests if tff is None else [t for t in tests if _needs_tff(t) == tff]


# Modules that import Keras 3 when imported (the Keras 3 route's layers): not on the tff track, whose Keras is 2.14.
KERAS3_MODULES = ("tensorfleet.edge.keras3_layers",)


def _keras3_installed() -> bool:
    from tensorfleet.compat.keras import keras_major

    return keras_major("keras") >= 3


def _modules_with_examples() -> list[str]:
    names = ["tensorfleet"] + [info.name for info in pkgutil.walk_packages(tensorfleet.__path__, prefix="tensorfleet.")]
    names = [n for n in names if not n.endswith("__main__") and (n not in KERAS3_MODULES or _keras3_installed())]
    return sorted(name for name in names if _examples(name))


def _cases() -> list[object]:
    cases = []
    for name in _modules_with_examples():
        if _examples(name, tff=False):
            cases.append(pytest.param(name, False, id=name))
        if _examples(name, tff=True):
            cases.append(pytest.param(name, True, id=f"{name}:tff", marks=pytest.mark.tff))
    return cases


@pytest.mark.parametrize("name,tff", _cases())
def test_docstring_examples_run_as_shown(name, tff, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list[str] = []
    for test in _examples(name, tff=tff):
        runner.run(test, out=failures.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(failures)


def test_the_public_entry_points_have_examples():
    # The modules users start from; a module that loses all its examples drops out of the test above.
    for name in ("tensorfleet.strategies.data_parallel", "tensorfleet.strategies.registry",
                 "tensorfleet.federated.simulation", "tensorfleet.edge.convert", "tensorfleet.planner.plans"):
        assert _examples(name, tff=False), f"{name} has no docstring examples that run without TFF"


def test_examples_that_name_tff_are_told_apart_from_the_others():
    def test(source: str) -> doctest.DocTest:
        return doctest.DocTestParser().get_doctest(source, {}, "probe", None, 0)

    assert _needs_tff(test(">>> import tensorflow_federated as tff\n"))
    assert _needs_tff(test(">>> Simulation(model_fn, clients, backend='tff')\n"))
    assert not _needs_tff(test(">>> from tensorfleet.federated import partition\n>>> tff_available()\nFalse\n"))
