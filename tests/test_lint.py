"""The code has no unused or undefined names, no syntax errors, and no function of cyclomatic complexity over
10 (ruff's pyflakes checks and C901, as `make lint`); it keeps the format standard (pycodestyle's E and W at
line length 120, isort's import order: docs/architecture.md, "Code layout"); the files let off a rule are
exactly those that need it."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")
PATHS = ["tensorfleet", "tests", "bench", "examples", "docs/hooks"]
FORMAT_RULES = ("E", "W", "I")  # the format standard, beside F and C901


def _lint_config() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)["tool"]["ruff"]["lint"]


def _findings(select: str) -> set[tuple[str, str]]:
    """(file, code) of what ruff finds in PATHS with ``select`` and no file let off."""
    result = subprocess.run([RUFF, "check", "--no-cache", "--select", select, "--output-format", "concise",
                             "--config", "lint.per-file-ignores = {}", *PATHS], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode in (0, 1) and "error" not in result.stderr.lower(), result.stderr  # ruff ran
    return {(m[1], m[2]) for m in re.finditer(r"^(\S+?):\d+:\d+: ([A-Z]+\d+)", result.stdout, re.M)}


def test_the_format_standard_is_selected():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        ruff = tomllib.load(handle)["tool"]["ruff"]
    assert set(FORMAT_RULES) | {"F", "C901"} <= set(ruff["lint"]["select"])
    assert ruff["line-length"] == 120
    assert set(ruff["lint"]["isort"]["known-first-party"]) == {"tensorfleet", "tests"}


@pytest.mark.slow
def test_ruff_finds_nothing_in_the_package_tests_benchmarks_and_examples():
    """ruff as `make lint` runs it: the project's configuration (pyproject.toml, found from ROOT), all its rules."""
    result = subprocess.run([RUFF, "check", "--no-cache", "--config", os.path.join(ROOT, "pyproject.toml"), *PATHS],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_complexity_is_checked_and_only_files_that_exceed_it_are_let_off():
    lint = _lint_config()
    assert "C901" in lint["select"] and lint["mccabe"]["max-complexity"] == 10
    let_off = {path for path, codes in lint["per-file-ignores"].items() if "C901" in codes}
    result = subprocess.run([RUFF, "check", "--no-cache", "--select", "C901", "--output-format", "concise",
                             "--config", "lint.per-file-ignores = {}", *PATHS], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    exceeding = {re.match(r"^(\S+?):\d+:\d+: C901", line)[1] for line in result.stdout.splitlines()
                 if re.match(r"^\S+?:\d+:\d+: C901", line)}
    assert result.returncode in (0, 1) and "error" not in result.stderr.lower(), result.stderr  # ruff ran
    assert exceeding == let_off, f"exceed C901 but not let off: {exceeding - let_off}; let off but within it " \
                                 f"(take them off pyproject.toml's list): {let_off - exceeding}"


@pytest.mark.slow
def test_only_files_that_break_a_format_rule_are_let_off_it():
    """A per-file-ignore of an E, W or I code names files that break it; once none does, the line comes off."""
    lint = _lint_config()
    found = _findings(",".join(FORMAT_RULES))
    stale = [f"{pattern}: {code}" for pattern, codes in lint["per-file-ignores"].items() for code in codes
             if code.startswith(FORMAT_RULES)
             and not any(fnmatch.fnmatch(path, pattern) and rule.startswith(code) for path, rule in found)]
    assert stale == [], f"let off but no longer needed (take them off pyproject.toml's list): {stale}"


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_files_setup_cfg_lists():
    """The core and the rooms setup.cfg's [mypy] names type-check (as `make lint`)."""
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^Success: no issues found in \d+ source files$", result.stdout, re.M), result.stdout
