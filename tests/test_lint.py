"""The code has no unused or undefined names and no syntax errors (ruff's pyflakes checks, as `make lint`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_ruff_finds_nothing_in_the_package_tests_benchmarks_and_examples():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    result = subprocess.run([ruff, "check", "--no-cache", "tensorfleet", "tests", "bench", "examples"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
