"""Size report: per-layer parameters, MACs and activations; flash/RAM against a board."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tensorfleet import edge
from tensorfleet.edge.report import layer_table, parse_board


@pytest.fixture(scope="module")
def int8_report(int8_artifact: Any) -> Any:
    return edge.report(int8_artifact, target="nano33ble", progress=False)


def test_layer_costs_of_the_digits_cnn(int8_artifact: Any) -> None:
    rows = layer_table(int8_artifact)
    assert [r.op for r in rows] == list(int8_artifact.ops)
    # conv 3x3x1->16 on 8x8: 8*8*16*9 MACs; conv 3x3x16->32: 8*8*32*144; dense 512->64; dense 64->10
    assert [r.macs for r in rows] == [9_216, 294_912, 0, 0, 32_768, 640]
    assert [r.output_shape for r in rows] == [(1, 8, 8, 16), (1, 8, 8, 32), (1, 4, 4, 32), (1, 512), (1, 64), (1, 10)]
    assert [r.activation_bytes for r in rows] == [1_024, 2_048, 512, 512, 64, 10]  # int8: one byte per element
    assert rows[0].params == 16 * 9 + 16 and rows[1].params == 32 * 144 + 32
    assert rows[4].params == 512 * 64 + 64 and rows[5].params == 64 * 10 + 10


@pytest.mark.slow
def test_report_totals_flash_ram_and_fit(int8_report: Any, int8_artifact: Any) -> None:
    rep = int8_report
    assert rep.flash_bytes == int8_artifact.size
    assert rep.arena_bytes == edge.find_arena_size(int8_artifact, progress=False)
    assert rep.total_macs == 337_536
    alloc = rep.arena_allocations
    assert alloc["head"] + alloc["tail"] == alloc["total"] <= rep.arena_bytes
    table = rep.table().splitlines()
    record = next(i for i, line in enumerate(table) if line.startswith("TFLM allocation record:"))
    kinds = {k: v for k, v in alloc.items() if k not in ("total", "head", "tail")}
    # The tail's line adds up to the tail: its kinds and what TFLM does not itemize; the next line, the arena.
    tail = table[record + 1]
    assert tail.startswith("  tail: ") and sum(int(n.replace(",", "")) for n in re.findall(r" ([\d,]+)(?:,|$)", tail)) \
        == alloc["tail"], tail
    assert len(re.findall(r" [\d,]+(?:,|$)", tail)) == len(kinds) + (sum(kinds.values()) < alloc["tail"])
    assert not table[record + 2].startswith("  the smallest arena")  # this model's smallest arena is the record's
    assert rep.arena_bytes == alloc["total"] and rep.as_dict()["arena_beyond_record_bytes"] == 0
    parts = rep.as_dict()["arena_allocations"]  # the JSON's parts add up to the tail too
    assert sum(v for k, v in parts.items() if k not in ("total", "head", "tail")) == parts["tail"] == alloc["tail"]
    assert rep.fit is not None and rep.fit.fits and rep.fit.reasons == ()
    assert rep.fit.flash_fraction == pytest.approx(int8_artifact.size / (1024 * 1024))
    assert rep.fit.ram_fraction == pytest.approx(rep.arena_bytes / (256 * 1024))


@pytest.mark.slow
def test_too_small_target_says_why(int8_artifact: Any, int8_report: Any) -> None:
    rep = edge.report(int8_artifact, target="flash=16K,ram=4K", arena_bytes=int8_report.arena_bytes)
    assert not rep.fit.fits
    assert rep.arena_allocator == "as given" and rep.as_dict()["arena_note"] == ""
    assert "RAM (TFLM arena, as given)" in rep.table() and "arena: a safe size" not in rep.table()
    assert rep.fit.reasons == (f"model needs {int8_artifact.size:,} bytes of flash, board has 16,384",
                               f"arena needs {int8_report.arena_bytes:,} bytes of RAM, board has 4,096")
    assert "does NOT fit" in rep.table()


@pytest.mark.slow  # its fixture runs the TFLite Micro checker, a process
def test_table_json_and_png(int8_report: Any, tmp_path: Path) -> None:
    table = int8_report.table()
    assert "FULLY_CONNECTED" in table and "337,536" in table
    assert (f"RAM (TFLM arena, TFLM Python interpreter's RecordingMicroAllocator): {int8_report.arena_bytes:,} "
            f"bytes") in table
    assert ("arena: a safe size for a firmware; with TFLM's plain MicroAllocator it needs 240-424 bytes less (the "
            "Python interpreter's recording allocator keeps its records in the arena)") in table.splitlines()
    data = json.loads(int8_report.save_json(tmp_path / "r.json").read_text())
    assert data["total_macs"] == 337_536 and data["target"]["fits"] is True
    assert data["arena_allocator"] == "TFLM Python interpreter's RecordingMicroAllocator"
    assert data["arena_note"].startswith("smallest arena with which the TFLM Python interpreter runs the model; its "
                                         "RecordingMicroAllocator keeps its records in the arena")
    assert len(data["layers"]) == 6
    png = int8_report.plot(tmp_path / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_model_tflm_cannot_run_has_no_arena_and_a_note(digits_artifacts: dict[str, Any]) -> None:
    rep = edge.report(digits_artifacts["float16"], target="pico", progress=False)
    assert rep.arena_bytes is None
    assert "float16" in rep.notes[0]
    assert not rep.fit.fits and "arena unknown" in rep.fit.reasons[0]


def test_boards_and_bad_targets() -> None:
    assert parse_board("bluepill") == edge.BOARDS.get("stm32f103c8")
    assert parse_board("flash=1.5M,ram=256KB").flash_bytes == 1_572_864
    with pytest.raises(ValueError, match=r"Unknown board 'nano33'. Did you mean 'nano33ble'\?"):
        parse_board("nano33")
    with pytest.raises(ValueError, match=r"ram must be a size like 256K or 1M. Received: ram='lots'"):
        parse_board("flash=1M,ram=lots")
    with pytest.raises(ValueError, match=r"needs exactly flash= and ram=.*Received: target='flash=1M'"):
        parse_board("flash=1M")


def test_a_huge_given_arena_is_refused(int8_artifact: Any) -> None:
    with pytest.raises(ValueError, match=r"arena_bytes must be an integer from 1 to 67108864. "
                                         r"Received: arena_bytes=4294967296"):
        edge.report(int8_artifact, arena_bytes=2**32)


@pytest.mark.slow
def test_the_arena_beyond_the_allocation_record_is_said(digits_flat: Any) -> None:
    # The digits MLP's smallest arena is more than TFLM's record of it (the room TFLM plans in, not recorded).
    from tensorfleet import models

    artifact = edge.convert(models.build("digits_mlp", keras="tf_keras"), "int8", digits_flat.x_train[:50],
                            progress=False)
    rep = edge.report(artifact, progress=False)
    beyond = rep.arena_bytes - rep.arena_allocations["total"]
    assert beyond > 0
    assert (f"  the smallest arena holds {beyond:,} bytes more than the record: room TFLM uses while it plans, which "
            "its recorder does not count") in rep.table().splitlines()
    assert rep.as_dict()["arena_beyond_record_bytes"] == beyond
