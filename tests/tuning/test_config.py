"""Options of a search refused at the boundary, before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorfleet.registry import UnknownNameError
from tensorfleet.tuning.config import SearchAlgorithm, SearchConfig, check_script
from tensorfleet.tuning.distributed import search

SCRIPT = str(Path(__file__).with_name("digits_search.py"))


def test_an_unknown_algorithm_lists_the_three(tmp_path):
    with pytest.raises(ValueError, match=r"^algorithm must be one of 'random', 'bayesian', 'hyperband'\. "
                                         r"Received: algorithm='grid'$"):
        search(SCRIPT, out_dir=tmp_path, algorithm="grid")


def test_algorithm_names_are_case_insensitive(tmp_path):
    assert SearchConfig(script=SCRIPT, out_dir=str(tmp_path),
                        algorithm="Hyperband").algorithm is SearchAlgorithm.HYPERBAND


def test_a_script_without_build_model_is_refused_naming_what_it_must_define(tmp_path):
    script = tmp_path / "search.py"
    script.write_text("def data():\n    return None\n")
    with pytest.raises(ValueError, match=r"defines no build_model\. It must define build_model\(hp\)"):
        search(script, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_imported_or_assigned_functions_count_as_defined(tmp_path):
    script = tmp_path / "search.py"
    script.write_text("from models import build_model\ndata = lambda: None\n")
    assert check_script(script) == script


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="No file at .* a Python search script"):
        search(tmp_path / "nope.py", out_dir=tmp_path)


@pytest.mark.parametrize(("options", "message"), [
    ({"workers": 0}, "workers must be a positive integer. Received: workers=0"),
    ({"max_trials": 2.5}, "max_trials must be a positive integer. Received: max_trials=2.5"),
    ({"direction": "up"}, "direction must be one of 'max', 'min'. Received: direction='up'"),
    ({"strategy": "parameter_server"}, "strategy must run inside one tuner worker"),
    ({"strategy": "one_device", "devices_per_trial": 2}, "devices_per_trial=2 needs a strategy over several devices"),
])
def test_bad_options_are_refused_with_the_value(tmp_path, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        SearchConfig(script=SCRIPT, out_dir=str(tmp_path), **options)


def test_an_unknown_strategy_gets_the_registrys_suggestion(tmp_path):
    with pytest.raises(UnknownNameError, match="Did you mean 'mirrored'"):
        SearchConfig(script=SCRIPT, out_dir=str(tmp_path), strategy="mirored")


def test_resume_has_the_glossarys_one_meaning(tmp_path):
    """resume=None continues a saved search (else begins), True requires one, False begins again; the library's
    errors name the keyword (and the flag beside it), not only a command line's --resume."""
    with pytest.raises(ValueError, match=r"^Nothing to resume in '.*empty': it holds no search\. Received: "
                                         r"resume=True \(--resume\); leave resume unset \(no --resume\) "
                                         r"to begin one\.$"):
        search(SCRIPT, out_dir=tmp_path / "empty", resume=True)
    with pytest.raises(ValueError, match=r"^resume must be None, true or false\. Received: resume='yes'$"):
        search(SCRIPT, out_dir=tmp_path, resume="yes")
    with pytest.warns(DeprecationWarning, match=r"search: 'fresh' is now 'resume'"), \
            pytest.raises(ValueError, match=r"'fresh' is the older name of 'resume'; give one of them\. "
                                            r"Received: fresh=True, resume=True$"):
        search(SCRIPT, out_dir=tmp_path, resume=True, fresh=True)  # fresh=True is resume=False
    with pytest.warns(DeprecationWarning, match=r"search: 'out' is now 'out_dir'"), \
            pytest.raises(ValueError, match=r"Nothing to resume in '.*empty'"):
        search(SCRIPT, out=tmp_path / "empty", resume=True)


def test_resume_refuses_other_options_than_the_saved_search(tmp_path):
    SearchConfig(script=SCRIPT, out_dir=str(tmp_path), max_trials=4).save()
    (tmp_path / "oracle").mkdir()
    for resume in (None, True):  # the default continues a saved search too, and refuses other options
        with pytest.raises(ValueError, match=r"holds a search with other options: max_trials=6 \(the search has 4\)\. "
                                             r"Give the same options to continue it, resume=False \(--fresh\) to "
                                             r"start over"):
            search(SCRIPT, out_dir=tmp_path, max_trials=6, resume=resume)


def test_out_is_out_dir_in_the_config_the_result_and_a_search_saved_by_the_previous_release(tmp_path):
    import json

    from tensorfleet.tuning.distributed import SearchResult

    with pytest.warns(DeprecationWarning, match=r"SearchConfig.__init__: 'out' is now 'out_dir'"):
        config = SearchConfig(script=SCRIPT, out=str(tmp_path), max_trials=4)
    assert config.out_dir == str(tmp_path.resolve())
    older = {("out" if key == "out_dir" else key): value for key, value in config.as_dict().items()}
    (tmp_path / "search.json").write_text(json.dumps(older))
    assert SearchConfig.load(tmp_path) == config  # read without a warning: the file is not the user's keyword
    result = SearchResult(tmp_path, "loss", "min", [], None, None, 1.0, 0)
    with pytest.warns(DeprecationWarning, match=r"SearchResult.out is now SearchResult.out_dir"):
        assert result.out == result.out_dir == tmp_path
