
import tensorfleet
from tensorfleet.cli.main import main


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tensorfleet {tensorfleet.__version__}\n"


def test_list_shows_every_strategy_with_aliases_and_whether_it_runs_here(capsys) -> None:
    assert main(["strategies", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "ALIASES", "HERE", "WHY"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert list(rows) == ["auto", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server",
                          "central_storage", "tpu"]
    assert rows["tpu"].split()[2] == "no"
    assert "mwms, multi_worker" in rows["multi_worker_mirrored"]
    assert "4 local devices" in rows["mirrored"]


def test_show_prints_options(capsys) -> None:
    assert main(["strategies", "show", "ps"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("parameter_server (aliases: ps): ParameterServerStrategy")
    assert "  options: cluster=None, max_shards=None, min_shard_bytes=None, staleness=None, serve=True" in out


def test_show_auto_says_what_it_would_choose(capsys) -> None:
    assert main(["strategies", "show", "auto"]) == 0
    assert "  here it would choose: mirrored (4 local CPU devices)" in capsys.readouterr().out


def test_unknown_strategy_is_one_clean_error_line(capsys) -> None:
    assert main(["strategies", "show", "mirorred"]) == 2
    captured = capsys.readouterr()
    assert captured.err == ("error: Unknown strategy 'mirorred'. Did you mean 'mirrored'? Available: auto, "
                            "one_device, mirrored, multi_worker_mirrored, parameter_server, central_storage, tpu.\n")
    assert captured.out == ""


def test_unknown_command_is_a_usage_error(capsys) -> None:
    assert main(["strategies", "frobnicate"]) == 2
