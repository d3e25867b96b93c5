"""``tensorfleet plan`` through the CLI entry point."""

from __future__ import annotations

import json

from tensorfleet.cli.main import main

BASE = ["plan", "--batch", "32", "--devices", "8", "--device-memory", "16GB", "--bandwidth", "100Gbps"]


def test_plan_prints_a_table_with_a_recommendation(capsys):
    assert main([*BASE, "--params", "1.5B"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("transformer-1.5B: 1.5B parameters (20 layers, hidden 2500, 19 heads, seq_len 1024; shape "
                          "assumed GPT-3-like, give layers, hidden and heads)\n")
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


def test_plan_takes_a_known_transformer_and_its_sequence_length(capsys):
    xl = ["plan", "--transformer", "gpt2-xl", "--batch", "1", "--devices", "1", "--device-memory", "32GB",
          "--bandwidth", "100Gbps", "--json"]
    assert main(xl) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["model"] == "gpt2_xl" and printed["parameters"] == 1_557_611_200
    assert printed["shape"] == {"layers": 48, "hidden": 1600, "heads": 25, "seq_len": 1024, "vocab": 50257,
                                "encoder": False, "seq_len_planned": 1024, "assumed": False}
    allreduce = next(s for s in printed["strategies"] if s["strategy"] == "data_allreduce")
    assert allreduce["note"] == "ring all-reduce; full recomputation"  # 34.10 GB without it
    assert main([*xl, "--seq-len", "256"]) == 0
    allreduce = next(s for s in json.loads(capsys.readouterr().out)["strategies"] if s["strategy"] == "data_allreduce")
    assert allreduce["memory"]["activations"] == (48 * 256 * (34 * 1600 + 5 * 25 * 256) + 5 * 256 * 1600
                                                  + 4 * 256 * 50257)
    assert allreduce["fits"] and allreduce["note"] == "ring all-reduce"


def test_plan_takes_heads_and_parameter_servers(capsys):
    args = ["plan", "--params", "1557611200", "--layers", "48", "--hidden", "1600", "--heads", "25", "--batch", "1",
            "--devices", "1", "--device-memory", "32GB", "--bandwidth", "100Gbps", "--ps-servers", "2",
            "--server-memory", "16GB", "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    ps = next(s for s in printed["strategies"] if s["strategy"] == "data_ps")
    assert ps["server_memory_bytes"] == 6 * 1_557_611_200 and ps["fits"]
    assert (printed["inputs"]["ps_servers"], printed["inputs"]["server_memory_bytes"]) == (2, 16e9)
    assert main([a for a in args if a not in ("--heads", "25")]) == 2
    assert capsys.readouterr().err.startswith("error: Give hidden and heads together: ")


def test_plan_refuses_a_bandwidth_without_a_unit(capsys):
    assert main([*BASE[:-1], "100", "--params", "1B"]) == 2
    assert capsys.readouterr().err.strip() == "error: A bandwidth needs a unit, such as '100Gbps'. Received: '100'"


def test_plan_takes_a_zero_stage_and_refuses_one_out_of_range(capsys):
    args = [*BASE, "--params", "1.5B", "--layers", "20", "--hidden", "2500", "--heads", "20", "--json"]
    assert main([*args, "--zero", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    allreduce = next(s for s in printed["strategies"] if s["strategy"] == "data_allreduce")
    assert printed["inputs"]["zero"] == 3 and allreduce["note"].startswith("ring all-reduce; ZeRO stage 3")
    # 16 bytes per parameter of mixed-precision Adam over 8 replicas.
    assert round(allreduce["memory"]["model_states"]) == 16 * 1.5e9 / 8
    assert main([*args, "--zero", "4"]) == 2
    assert capsys.readouterr().err.strip() == "error: zero must be an integer from 0 to 3. Received: zero=4"
