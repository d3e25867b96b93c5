"""The CLI's boundary: bad input is one ``error:`` line and exit 2; a bug in tensorfleet is not."""

from __future__ import annotations

import pytest

import tensorfleet.capabilities
from tensorfleet.cli.main import REPORT_BUG, main


@pytest.mark.parametrize("bug", [TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
                                 KeyError("features"), AttributeError("'NoneType' object has no attribute 'key'")])
def test_an_internal_error_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys, bug):
    def broken() -> dict:
        raise bug

    monkeypatch.setattr(tensorfleet.capabilities, "versions", broken)
    assert main(["info"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.rstrip().splitlines()[-1] == REPORT_BUG
    assert f"{type(bug).__name__}: " in err and "error: " not in err


def test_bad_input_is_one_error_line_and_exit_2(capsys):
    assert main(["plan", "--model", "digits_cnnn", "--batch", "32", "--devices", "2", "--device-memory", "16GB",
                 "--bandwidth", "10Gbps"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: Unknown model 'digits_cnnn'. Did you mean 'digits_cnn'? Available: "
                   + err[0].split("Available: ", 1)[1]]
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize(("argv", "line"), [
    (["federated", "run", "--rounds", "2.5"], "error: Invalid value for '--rounds': Input should be a valid integer, "
                                              "unable to parse string as an integer. Received: --rounds '2.5'"),
    (["plan", "--batch=big"], "error: Invalid value for '--batch': Input should be a valid integer, unable to parse "
                              "string as an integer. Received: --batch 'big'"),
    (["federated", "run", "--backend", "gpu"], "error: Invalid value for '--backend': 'gpu' is not one of 'tff', "
                                               "'compiled', 'auto'. Received: --backend 'gpu'"),
    (["edge", "convert", "digits_cnn"], "error: Missing option '--out' / '-o'."),
    (["launch", "--wokers", "2", "train.py"], "error: No such option: --wokers. Did you mean --workers?"),
])
def test_a_command_line_that_does_not_parse_is_one_error_line_too(capsys, argv, line):
    # click's own form (a usage line, a hint, "Error: ..." and its wrapper's "Value error, ") said it in other words.
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"
