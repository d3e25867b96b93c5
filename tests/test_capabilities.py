"""The README's compatibility matrix says what each track runs: checked against this environment's probes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
COLUMNS = ("current", "tff", "keras3", "keras2")


def _matrix() -> dict[str, dict[str, str]]:
    text = README.read_text()
    block = text.split("<!-- matrix:start -->", 1)[1].split("<!-- matrix:end -->", 1)[0]
    rows = {}
    for line in block.splitlines():
        match = re.match(r"^\| `([a-z-]+)` [^|]*" + r"\| (yes|no|-)[^|]*" * 4 + r"\|$", line.strip())
        if match:
            rows[match.group(1)] = dict(zip(COLUMNS, match.group(2, 3, 4, 5)))
    return rows


def _track() -> str:
    from tensorfleet.compat.tff import tff_available

    return "tff" if tff_available() else "current"


def test_the_matrix_names_every_feature_once() -> None:
    from tensorfleet.capabilities import FEATURES

    assert list(_matrix()) == [feature.key for feature in FEATURES]


@pytest.mark.parametrize("column", [pytest.param("current"), pytest.param("tff", marks=pytest.mark.tff)])
def test_the_readme_matrix_is_what_this_track_runs(column: str) -> None:
    from tensorfleet.capabilities import probe_all

    if _track() != column:
        pytest.skip(f"this environment is the {_track()} track")
    claimed = {key: cells[column] == "yes" for key, cells in _matrix().items()}
    found = {p.key: p.available for p in probe_all()}
    reasons = {p.key: p.reason for p in probe_all() if p.reason}
    assert found == claimed, f"README's {column} column differs from this environment: {reasons}"


def test_the_readme_keras_columns_are_what_each_feature_runs() -> None:
    from tensorfleet.capabilities import FEATURES, NO_KERAS

    def cell(declared: str) -> str:
        return "yes" if not declared else ("-" if declared == NO_KERAS else "no")

    declared = {f.key: {"keras3": cell(f.keras3), "keras2": cell(f.keras2)} for f in FEATURES}
    assert {key: {k: cells[k] for k in ("keras3", "keras2")} for key, cells in _matrix().items()} == declared


def test_a_feature_that_runs_keras3_says_yes_where_keras3_is_installed(keras3) -> None:
    from tensorfleet.capabilities import FEATURES, probe_all

    runs = {f.key for f in FEATURES if not f.keras3}
    assert {p.key for p in probe_all() if p.keras3 == "yes"} == runs


@pytest.mark.slow
def test_info_prints_versions_and_each_feature(capsys: pytest.CaptureFixture[str]) -> None:
    import tensorflow as tf

    from tensorfleet.capabilities import FEATURES
    from tensorfleet.cli.main import main

    assert main(["info", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["versions"]["tensorflow"] == tf.__version__
    assert [f["key"] for f in printed["features"]] == [f.key for f in FEATURES]
    for feature in printed["features"]:
        assert feature["available"] == (feature["reason"] == "")
    assert {f["key"]: f["keras3"] for f in printed["features"]}["federated-dp"] == "-"
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("python ") and f"tensorflow {tf.__version__}" in lines[0]
    assert lines[1].split() == ["feature", "Keras", "3", "tf_keras"]
    assert len(lines) == 2 + len(FEATURES)
