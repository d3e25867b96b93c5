"""`auto` tells the user what it chose, on stderr, without any logging set up."""

from __future__ import annotations

import tensorfleet as tfl


def test_auto_prints_its_choice_and_reason(capsys, monkeypatch, logical_cpus) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    strategy = tfl.strategies.build("auto")
    assert strategy.num_replicas_in_sync == 4
    captured = capsys.readouterr()
    assert captured.err == "tensorfleet: strategy 'auto' chose 'mirrored' (4 local CPU devices)\n"
    assert captured.out == ""
    tfl.strategies.build("auto", announce=False)
    assert capsys.readouterr().err == ""
