"""Size report of a converted model: flash, RAM (arena), and per-layer parameters, MACs and activations.

The per-layer numbers come from the flatbuffer: parameters are the elements of each operator's
constant inputs, activations are the bytes of its outputs, MACs are counted for the
operators that do multiply-accumulates (convolutions, depthwise convolutions, fully connected,
transposed convolutions, batch matmul). Flash is the flatbuffer length; RAM is the smallest
arena with which the TFLite Micro Python interpreter runs the model (measured, see
:func:`find_arena_size`): its RecordingMicroAllocator keeps records in the arena, so a firmware
with the plain MicroAllocator needs a little less, and the number is a safe size to declare.
Neither counts the application's code or the TFLM library itself.

Example:
    >>> rep = report(artifact, target="arduino_nano_33_ble")    # doctest: +SKIP
    >>> print(rep.table())                                       # doctest: +SKIP
    >>> rep.save_json("out/report.json"); rep.plot("out/report.png")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensorfleet.edge.artifact import Graph, OpInfo, TFLiteArtifact
from tensorfleet.edge.errors import MicroIncompatibleError
from tensorfleet.edge.micro import ARENA_ALLOCATOR, ARENA_NOTE, MAX_ARENA_BYTES, arena_allocations, find_arena_size
from tensorfleet.io import save_figure, write_json
from tensorfleet.registry import Registry
from tensorfleet.validation import integer

__all__ = ["Board", "BOARDS", "LayerInfo", "EdgeReport", "FitResult", "report", "layer_table", "parse_board"]


@dataclass(frozen=True)
class Board:
    """A target's flash and RAM in bytes."""

    name: str
    flash_bytes: int
    ram_bytes: int
    mcu: str = ""


BOARDS: Registry[Board] = Registry("board")
for _board, _aliases, _desc in [
    (Board("arduino_nano_33_ble", 1024 * 1024, 256 * 1024, "nRF52840 (Cortex-M4F)"), ("nano33ble",),
     "Arduino Nano 33 BLE (Sense): nRF52840, 1 MB flash, 256 KB SRAM"),
    (Board("nucleo_l4r5zi", 2 * 1024 * 1024, 640 * 1024, "STM32L4R5ZI (Cortex-M4F)"), ("l4r5zi",),
     "ST Nucleo-L4R5ZI, MLPerf Tiny's reference board: 2 MB flash, 640 KB SRAM"),
    (Board("stm32f746g_disco", 1024 * 1024, 320 * 1024, "STM32F746NG (Cortex-M7)"), ("f746",),
     "ST STM32F746G-DISCO: 1 MB flash, 320 KB SRAM"),
    (Board("raspberry_pi_pico", 2 * 1024 * 1024, 264 * 1024, "RP2040 (Cortex-M0+)"), ("pico", "rp2040"),
     "Raspberry Pi Pico: RP2040, 2 MB QSPI flash, 264 KB SRAM"),
    (Board("esp32_devkitc", 4 * 1024 * 1024, 520 * 1024, "ESP32 (Xtensa LX6)"), ("esp32",),
     "Espressif ESP32-DevKitC: 4 MB flash, 520 KB SRAM"),
    (Board("sparkfun_edge", 1024 * 1024, 384 * 1024, "Ambiq Apollo3 (Cortex-M4F)"), ("apollo3",),
     "SparkFun Edge: Apollo3 Blue, 1 MB flash, 384 KB SRAM"),
    (Board("nrf52832", 512 * 1024, 64 * 1024, "nRF52832 (Cortex-M4F)"), (),
     "Nordic nRF52832: 512 KB flash, 64 KB RAM"),
    (Board("stm32f103c8", 64 * 1024, 20 * 1024, "STM32F103C8 (Cortex-M3)"), ("bluepill",),
     "STM32F103C8 'Blue Pill': 64 KB flash, 20 KB RAM"),
]:
    BOARDS.register(_board.name, _board, aliases=_aliases, description=_desc)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)(?:i?[bB])?\s*$")


def _parse_size(text: str, what: str) -> int:
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{what} must be a size like 256K or 1M. Received: {what}={text!r}")
    value, unit = float(match.group(1)), match.group(2).upper()
    return int(value * {"": 1, "K": 1024, "M": 1024 * 1024}[unit])


def parse_board(target: str | Board) -> Board:
    """A registered board name, or ``"flash=1M,ram=256K"`` for a custom target."""
    if isinstance(target, Board):
        return target
    if not isinstance(target, str):
        raise TypeError(f"target must be a board name or 'flash=..,ram=..'. Received: {target!r}")
    if "=" in target:
        parts = dict(p.split("=", 1) for p in target.replace(" ", "").split(",") if "=" in p)
        if set(parts) != {"flash", "ram"}:
            raise ValueError(f"A custom target needs exactly flash= and ram=, e.g. 'flash=1M,ram=256K'. "
                             f"Received: target={target!r}")
        return Board("custom", _parse_size(parts["flash"], "flash"), _parse_size(parts["ram"], "ram"))
    return BOARDS.get(target)


@dataclass(frozen=True)
class LayerInfo:
    """One operator's share: parameters (constant elements), MACs, output activation bytes."""

    index: int
    op: str
    output_shape: tuple[int, ...]
    params: int
    param_bytes: int
    macs: int
    activation_bytes: int


def _macs(op: OpInfo, graph: Graph) -> int:
    tensors = graph.tensors
    if not op.outputs:
        return 0
    out = tensors[op.outputs[0]]
    ins = [tensors[i] for i in op.inputs if i >= 0]
    if op.op == "CONV_2D" and len(ins) >= 2 and len(ins[1].shape) == 4:
        _, kh, kw, cin = ins[1].shape
        return out.num_elements * kh * kw * cin
    if op.op == "DEPTHWISE_CONV_2D" and len(ins) >= 2 and len(ins[1].shape) == 4:
        _, kh, kw, _ = ins[1].shape
        return out.num_elements * kh * kw
    if op.op == "FULLY_CONNECTED" and len(ins) >= 2 and len(ins[1].shape) == 2:
        return out.num_elements * ins[1].shape[1]
    if op.op == "TRANSPOSE_CONV" and len(ins) >= 3 and len(ins[1].shape) == 4:
        data = ins[2]
        cout, kh, kw, _ = ins[1].shape
        return data.num_elements * kh * kw * cout
    if op.op == "BATCH_MATMUL" and len(ins) >= 2 and ins[0].shape:
        return out.num_elements * ins[0].shape[-1]
    return 0


def layer_table(artifact: TFLiteArtifact) -> list[LayerInfo]:
    """Per-operator parameters, MACs and activation bytes, in execution order."""
    graph = artifact.graph
    rows = []
    for op in graph.operators:
        consts = [graph.tensors[i] for i in op.inputs if i >= 0 and graph.tensors[i].is_constant]
        outs = [graph.tensors[i] for i in op.outputs if i >= 0]
        rows.append(LayerInfo(op.index, op.op, outs[0].shape if outs else (),
                              sum(t.num_elements for t in consts), sum(t.nbytes for t in consts),
                              _macs(op, graph), sum(t.nbytes for t in outs)))
    return rows


@dataclass(frozen=True)
class FitResult:
    """Whether a model fits a board, with the fraction of flash and RAM it takes."""

    board: Board
    fits: bool
    flash_fraction: float
    ram_fraction: float | None
    reasons: tuple[str, ...]


@dataclass
class EdgeReport:
    """Flash, RAM and per-layer costs of one converted model; see :func:`report`."""

    quantization: str
    flash_bytes: int
    arena_bytes: int | None
    layers: list[LayerInfo]
    fit: FitResult | None = None
    notes: list[str] = field(default_factory=list)
    arena_allocations: dict[str, int] = field(default_factory=dict)
    arena_allocator: str = ARENA_ALLOCATOR  # whose smallest arena arena_bytes is ("as given" when passed in)

    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def total_macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    @property
    def peak_activation_bytes(self) -> int:
        return max((layer.activation_bytes for layer in self.layers), default=0)

    def as_dict(self) -> dict[str, Any]:
        out = {"quantization": self.quantization, "flash_bytes": self.flash_bytes,
               "arena_bytes": self.arena_bytes, "arena_allocator": self.arena_allocator,
               "arena_note": ARENA_NOTE if self.arena_allocator == ARENA_ALLOCATOR else "",
               "total_params": self.total_params,
               "total_macs": self.total_macs, "peak_activation_bytes": self.peak_activation_bytes,
               "arena_allocations": self._allocations_adding_up(),
               "arena_beyond_record_bytes": self._beyond_record(),
               "layers": [asdict(layer) for layer in self.layers], "notes": list(self.notes)}
        if self.fit is not None:
            out["target"] = {"board": asdict(self.fit.board), "fits": self.fit.fits,
                             "flash_fraction": self.fit.flash_fraction, "ram_fraction": self.fit.ram_fraction,
                             "reasons": list(self.fit.reasons)}
        return out

    def table(self) -> str:
        """A plain-text table: one row per operator, then the totals and the target verdict."""
        head = f"{'#':>3}  {'op':<20} {'output':<16} {'params':>9} {'MACs':>11} {'act. bytes':>10}"
        lines = [head, "-" * len(head)]
        for layer in self.layers:
            shape = "x".join(str(d) for d in layer.output_shape)
            lines.append(f"{layer.index:>3}  {layer.op:<20} {shape:<16} {layer.params:>9,} {layer.macs:>11,} "
                         f"{layer.activation_bytes:>10,}")
        lines.append("-" * len(head))
        lines.append(f"     {'total':<20} {'':<16} {self.total_params:>9,} {self.total_macs:>11,} "
                     f"{self.peak_activation_bytes:>10,} (peak)")
        arena = f"{self.arena_bytes:,} bytes" if self.arena_bytes is not None else "n/a (TFLM cannot run it)"
        lines.append(f"flash (model): {self.flash_bytes:,} bytes   RAM (TFLM arena, {self.arena_allocator}): "
                     f"{arena}   quantization: {self.quantization}")
        if self.arena_bytes is not None and self.arena_allocator == ARENA_ALLOCATOR:
            lines.append("arena: a safe size for a firmware; with TFLM's plain MicroAllocator it needs 240-424 bytes "
                         "less (the Python interpreter's recording allocator keeps its records in the arena)")
        lines.extend(self._allocation_lines())
        if self.fit is not None:
            b = self.fit.board
            verdict = "fits" if self.fit.fits else "does NOT fit"
            ram = f"{self.fit.ram_fraction:.1%}" if self.fit.ram_fraction is not None else "?"
            lines.append(f"target {b.name} (flash {b.flash_bytes:,}, RAM {b.ram_bytes:,}): {verdict} - "
                         f"flash {self.fit.flash_fraction:.1%}, RAM {ram}"
                         + (f" ({'; '.join(self.fit.reasons)})" if self.fit.reasons else ""))
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    _NOT_ITEMIZED = "TFLM's own structures (not itemized)"

    def _allocations_adding_up(self) -> dict[str, int]:
        """TFLM's record with the tail's rest as one more part (:attr:`_NOT_ITEMIZED`), so the kinds sum to it."""
        alloc = dict(self.arena_allocations)
        kinds = [k for k in alloc if k not in ("total", "head", "tail")]
        if kinds and "tail" in alloc and alloc["tail"] > sum(alloc[k] for k in kinds):
            alloc[self._NOT_ITEMIZED] = alloc["tail"] - sum(alloc[k] for k in kinds)
        return alloc

    def _beyond_record(self) -> int | None:
        """Bytes the smallest (measured) arena holds beyond TFLM's record of it; None where not measured."""
        total = self.arena_allocations.get("total")
        if total is None or self.arena_bytes is None or self.arena_allocator != ARENA_ALLOCATOR:
            return None
        return self.arena_bytes - total

    def _allocation_lines(self) -> list[str]:
        """TFLM's record of the arena, its parts adding up: the tail's kinds and what TFLM does not itemize, and
        what the smallest arena holds beyond the record."""
        alloc = self.arena_allocations
        if not {"total", "head", "tail"} <= set(alloc):
            return []
        lines = [f"TFLM allocation record: {alloc['total']:,} bytes = head {alloc['head']:,} (planned activations) + "
                 f"tail {alloc['tail']:,} (persistent)"]
        kinds = {k: v for k, v in self._allocations_adding_up().items() if k not in ("total", "head", "tail")}
        if kinds:
            lines.append("  tail: " + ", ".join(f"{kind} {size:,}" for kind, size in kinds.items()))
        beyond = self._beyond_record()
        if beyond:
            lines.append(f"  the smallest arena holds {beyond:,} bytes more than the record: room TFLM uses while it "
                         "plans, which its recorder does not count")
        return lines

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        return write_json(path, self.as_dict())

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """A PNG with per-layer parameters, MACs and activation sizes, and the flash/RAM budget."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        labels = [f"{layer.index} {layer.op}" for layer in self.layers]
        y = np.arange(len(labels))
        height = max(3.0, 0.28 * len(labels) + 1.5)
        fig, axes = plt.subplots(1, 3, figsize=(15, height), sharey=True)
        for ax, values, title, colour in [
            (axes[0], [layer.param_bytes / 1024 for layer in self.layers], "weights (KiB, flash)", "tab:blue"),
            (axes[1], [layer.macs / 1e3 for layer in self.layers], "MACs (thousands)", "tab:green"),
            (axes[2], [layer.activation_bytes / 1024 for layer in self.layers], "output activation (KiB)",
             "tab:orange"),
        ]:
            ax.barh(y, values, color=colour)
            ax.set_title(title)
            ax.grid(axis="x", alpha=0.3)
        axes[0].set_yticks(y, labels, fontsize=7)
        axes[0].invert_yaxis()
        if self.arena_bytes:
            axes[2].axvline(self.arena_bytes / 1024, color="red", linestyle="--",
                            label=f"arena {self.arena_bytes / 1024:.1f} KiB")
            axes[2].legend(loc="lower right", fontsize=8)
        title = f"{self.quantization}: flash {self.flash_bytes / 1024:.1f} KiB"
        if self.arena_bytes:
            title += f", arena {self.arena_bytes / 1024:.1f} KiB"
        if self.fit is not None:
            title += f" - {self.fit.board.name}: {'fits' if self.fit.fits else 'does not fit'}"
        fig.suptitle(title)
        return save_figure(fig, path)


def _fit(board: Board, flash: int, arena: int | None) -> FitResult:
    reasons = []
    flash_fraction = flash / board.flash_bytes
    if flash > board.flash_bytes:
        reasons.append(f"model needs {flash:,} bytes of flash, board has {board.flash_bytes:,}")
    ram_fraction = None if arena is None else arena / board.ram_bytes
    if arena is None:
        reasons.append("arena unknown: TFLM cannot run this model")
    elif arena > board.ram_bytes:
        reasons.append(f"arena needs {arena:,} bytes of RAM, board has {board.ram_bytes:,}")
    return FitResult(board, not reasons, flash_fraction, ram_fraction, tuple(reasons))


def report(artifact: TFLiteArtifact, *, target: str | Board | None = None, arena_bytes: int | None = None,
           measure_arena: bool = True, progress: bool = True) -> EdgeReport:
    """Flash, RAM (TFLM arena) and per-layer parameters, MACs and activation sizes.

    Args:
        artifact: the converted model.
        target: a board from :data:`BOARDS` (or ``"flash=1M,ram=256K"``); the report says whether it fits.
        arena_bytes: a known arena size (reported "as given"); otherwise, with ``measure_arena``, the
            smallest with which the TFLM Python interpreter runs the model, a safe size for a firmware
            (see :data:`~tensorfleet.edge.micro.ARENA_NOTE`).

    Example:
        >>> rep = report(artifact, target="nano33ble")   # doctest: +SKIP
        >>> rep.fit.fits, rep.arena_bytes                # doctest: +SKIP
        (True, 24248)
    """
    if not isinstance(artifact, TFLiteArtifact):
        raise TypeError(f"artifact must be a TFLiteArtifact. Received: {type(artifact).__name__}")
    integer("arena_bytes", arena_bytes, minimum=1, maximum=MAX_ARENA_BYTES, optional=True)
    board = parse_board(target) if target is not None else None
    notes: list[str] = []
    measured = arena_bytes is None
    if arena_bytes is None and measure_arena:
        try:
            arena_bytes = find_arena_size(artifact, progress=progress)
        except MicroIncompatibleError as exc:
            notes.append(str(exc))
    allocations: dict[str, int] = {}
    if arena_bytes is not None and measure_arena:
        allocations = arena_allocations(artifact, arena_bytes)
    rep = EdgeReport(artifact.quantization, artifact.size, arena_bytes, layer_table(artifact), notes=notes,
                     arena_allocations=allocations, arena_allocator=ARENA_ALLOCATOR if measured else "as given")
    if board is not None:
        rep.fit = _fit(board, artifact.size, arena_bytes)
    return rep
