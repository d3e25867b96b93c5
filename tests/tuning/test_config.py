"""Options of a search refused at the boundary, before any process starts."""

from __future__ import annotations

import pytest
from pathlib import Path

from tensorfleet.registry import UnknownNameError
from tensorfleet.tuning.config import SearchAlgorithm, SearchConfig, check_script
from tensorfleet.tuning.distributed import search

SCRIPT = str(Path(__file__).with_name("digits_search.py"))


def test_an_unknown_algorithm_lists_the_three(tmp_path):
    with pytest.raises(ValueError, match=r"^algorithm must be one of 'random', 'bayesian', 'hyperband'\. "
                                         r"Received: algorithm='grid'$"):
        search(SCRIPT, out=tmp_path, algorithm="grid")


def test_algorithm_names_are_case_insensitive(tmp_path):
    assert SearchConfig(script=SCRIPT, out=str(tmp_path), algorithm="Hyperband").algorithm is SearchAlgorithm.HYPERBAND


def test_a_script_without_build_model_is_refused_naming_what_it_must_define(tmp_path):
    script = tmp_path / "search.py"
    script.write_text("def data():\n    return None\n")
    with pytest.raises(ValueError, match=r"defines no build_model\. It must define build_model\(hp\)"):
        search(script, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_imported_or_assigned_functions_count_as_defined(tmp_path):
    script = tmp_path / "search.py"
    script.write_text("from models import build_model\ndata = lambda: None\n")
    assert check_script(script) == script


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="No file at .* a Python search script"):
        search(tmp_path / "nope.py", out=tmp_path)


@pytest.mark.parametrize(("options", "message"), [
    ({"workers": 0}, "workers must be a positive integer. Received: workers=0"),
    ({"max_trials": 2.5}, "max_trials must be a positive integer. Received: max_trials=2.5"),
    ({"direction": "up"}, "direction must be one of 'max', 'min'. Received: direction='up'"),
    ({"strategy": "parameter_server"}, "strategy must run inside one tuner worker"),
    ({"strategy": "one_device", "devices_per_trial": 2}, "devices_per_trial=2 needs a strategy over several devices"),
])
def test_bad_options_are_refused_with_the_value(tmp_path, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        SearchConfig(script=SCRIPT, out=str(tmp_path), **options)


def test_an_unknown_strategy_gets_the_registrys_suggestion(tmp_path):
    with pytest.raises(UnknownNameError, match="Did you mean 'mirrored'"):
        SearchConfig(script=SCRIPT, out=str(tmp_path), strategy="mirored")


def test_an_existing_search_is_not_overwritten_without_resume_or_fresh(tmp_path):
    (tmp_path / "oracle").mkdir()
    with pytest.raises(ValueError, match="already holds a search. Pass --resume to continue it, --fresh"):
        search(SCRIPT, out=tmp_path)
    with pytest.raises(ValueError, match="Nothing to resume in"):
        search(SCRIPT, out=tmp_path / "empty", resume=True)


def test_resume_refuses_other_options_than_the_saved_search(tmp_path):
    SearchConfig(script=SCRIPT, out=str(tmp_path), max_trials=4).save()
    (tmp_path / "oracle").mkdir()
    with pytest.raises(ValueError, match=r"these differ: max_trials=6 \(the search has 4\)"):
        search(SCRIPT, out=tmp_path, max_trials=6, resume=True)
