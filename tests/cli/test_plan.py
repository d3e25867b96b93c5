"""``tensorfleet plan`` through the CLI entry point."""

from __future__ import annotations

import json

from tensorfleet.cli.main import main

BASE = ["plan", "--batch", "32", "--devices", "8", "--device-memory", "16GB", "--bandwidth", "100Gbps"]


def test_plan_prints_a_table_with_a_recommendation(capsys):
    assert main([*BASE, "--params", "1.5B"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("transformer-1.5B: 1.5B parameters")
    for name in ("data_allreduce", "data_ps", "tensor", "pipeline", "hybrid"):
        assert name in out
    assert "recommendation: pipeline -- fits (" in out


def test_plan_json_and_output_file(capsys, tmp_path):
    target = tmp_path / "plan.json"
    assert main([*BASE, "--model", "digits_cnn", "--json", "--output", str(target)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(target.read_text())
    assert printed["parameters"] == 38282
    # 7 layers cannot make 8 pipeline stages; the recommendation is the shortest fitting step.
    assert printed["impossible"] == {"pipeline": "8 stages but only 7 layers"}
    fitting = [s for s in printed["strategies"] if s["fits"]]
    assert printed["recommendation"] == min(fitting, key=lambda s: s["step_seconds"])["strategy"]
    assert printed["inputs"]["device_memory_bytes"] == 16e9 and printed["inputs"]["bandwidth_bytes_per_s"] == 12.5e9


def test_plan_errors_exit_2_with_one_line(capsys):
    assert main([*BASE[:-1], "100Gbs", "--params", "1B"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: Unknown bandwidth unit 'Gbs' in '100Gbs'; use bits per second (bps, Mbps, Gbps, Tbps) or "
        "bytes per second (B/s, MB/s, GB/s).")
    assert main(["plan", "--params", "175B", "--batch", "8", "--devices", "8", "--device-memory", "16GB",
                 "--bandwidth", "100Gbps"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: transformer-175B (175B parameters, batch 8) fits nowhere") and "missing" in err
    assert main([*BASE, "--params", "1B", "--model", "digits_cnn"]) == 2
    assert "exactly one of model" in capsys.readouterr().err
