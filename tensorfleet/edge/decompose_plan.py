"""One row of a decomposition plan: which form factors a layer, at which rank, and what it saves.

A method names the form for convolutions with a kh x kw kernel (``tucker2`` or ``cp``); Dense
layers and 1x1 Conv2D are matrices and take the ``svd`` form under every method. The rank of
a row comes from ``rank=`` (an int, a ``(r_in, r_out)`` pair for Tucker-2, ``"vbmf"``, or a dict
of those by layer name), or from ``energy=`` (see :mod:`tensorfleet.edge.decompose_rank`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

import numpy as np

from tensorfleet.edge.decompose_factors import (
    Factor,
    cp_factors,
    cp_full_rank,
    cp_kernel,
    fit_cp,
    kernel_of,
    layer_kind,
    layer_macs,
    svd_factors,
    svd_kernel,
    tucker2_factors,
    tucker2_kernel,
)
from tensorfleet.edge.decompose_rank import cp_energy, energy_rank, smallest_rank, vbmf_rank
from tensorfleet.edge.errors import DecompositionError
from tensorfleet.registry import Registry

__all__ = ["DecompositionMethod", "DecompositionForm", "FORMS", "LayerPlan", "plan_layer", "form_of"]


class DecompositionMethod(str, Enum):
    """How :func:`tensorfleet.edge.decompose` factors convolutions (Dense layers always take ``svd``)."""

    SVD = "svd"
    TUCKER2 = "tucker2"
    CP = "cp"


@dataclass(frozen=True)
class LayerPlan:
    """One layer with weights: the form and rank chosen, or why it is left alone."""

    name: str
    kind: str
    form: str | None
    rank: tuple[int, ...] | None
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int
    energy: float | None
    reason: str = ""
    factors: tuple[Factor, ...] = field(default=(), repr=False, compare=False)

    @property
    def decomposed(self) -> bool:
        return bool(self.factors)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "form": self.form,
                "rank": list(self.rank) if self.rank else None, "params_before": self.params_before,
                "params_after": self.params_after, "flops_before": 2 * self.macs_before,
                "flops_after": 2 * self.macs_after, "energy": self.energy, "reason": self.reason}


def form_of(kind: str | None, method: DecompositionMethod) -> str | None:
    """The factored form a layer kind takes under ``method``, or None when the method leaves it."""
    if kind in ("dense", "conv1x1"):
        return "svd"
    if kind == "conv" and method is not DecompositionMethod.SVD:
        return method.value
    return None


def _describe_kind(layer: Any) -> str:
    if layer_kind(layer) in ("conv", "conv1x1"):
        return f"Conv2D {layer.kernel_size[0]}x{layer.kernel_size[1]}"
    return type(layer).__name__


def _matrix(layer: Any) -> np.ndarray:
    kernel = kernel_of(layer)
    return kernel if kernel.ndim == 2 else kernel.reshape(-1, kernel.shape[-1])


def _unfold(kernel: np.ndarray, mode: int) -> np.ndarray:
    return np.moveaxis(kernel, mode, 0).reshape(kernel.shape[mode], -1)


def _too_big(layer: Any, rank: Any, largest: Any) -> DecompositionError:
    return DecompositionError(f"rank {rank!r} is too large for layer {layer.name!r} ({_describe_kind(layer)}, kernel "
                              f"{tuple(layer.kernel.shape)}): at most {largest}. Received: rank={rank!r}")


def _int_rank(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 1)


def _svd_rank(layer: Any, rank: Any, energy: float | None, strict: bool, allow_growth: bool) -> tuple[Any, ...]:
    matrix = _matrix(layer)
    full = min(matrix.shape)
    if energy is not None:
        return (energy_rank(matrix, energy),), None, ""
    if rank == "vbmf":
        return (vbmf_rank(matrix),), None, ""
    largest = full if strict else max(matrix.shape)
    if not _int_rank(rank) or rank > largest:
        raise _too_big(layer, rank, f"{largest} (an integer)")
    return (min(int(rank), full),), None, ""


def _tucker2_rank(layer: Any, rank: Any, energy: float | None, strict: bool, allow_growth: bool) -> tuple[Any, ...]:
    kernel = kernel_of(layer)
    cin, cout = kernel.shape[2:]
    if energy is not None:
        return (energy_rank(_unfold(kernel, 2), energy), energy_rank(_unfold(kernel, 3), energy)), None, ""
    if rank == "vbmf":
        return (vbmf_rank(_unfold(kernel, 2)), vbmf_rank(_unfold(kernel, 3))), None, ""
    if isinstance(rank, (tuple, list)):
        if len(rank) != 2 or not all(_int_rank(r) for r in rank) or rank[0] > cin or rank[1] > cout:
            raise _too_big(layer, rank, f"({cin}, {cout}) as (input, output) channel ranks")
        return (int(rank[0]), int(rank[1])), None, ""
    if not _int_rank(rank) or rank > max(cin, cout):
        raise _too_big(layer, rank, f"{max(cin, cout)} (an integer, capped at each channel count) or a pair")
    return (min(int(rank), cin), min(int(rank), cout)), None, ""


def _cp_rank(layer: Any, rank: Any, energy: float | None, strict: bool, allow_growth: bool) -> tuple[Any, ...]:
    kernel = kernel_of(layer)
    before = int(layer.count_params())
    full = cp_full_rank(kernel.shape)
    if energy is None:
        if rank == "vbmf":
            raise DecompositionError("rank='vbmf' chooses ranks for the svd and tucker2 forms, not for cp. "
                                     "Received: method='cp', rank='vbmf'; pass an integer rank or energy=")
        if not _int_rank(rank) or rank > full:
            raise _too_big(layer, rank, f"{full} (an integer)")
        return (int(rank),), None, ""
    fits: dict[int, Any] = {}

    def reaches(r: int) -> bool:
        fits[r] = fit_cp(kernel, r)
        return cp_energy(kernel, fits[r]) >= energy - 1e-12

    per_rank = sum(kernel.shape)
    break_even = full if allow_growth else min(full, (before - 1) // per_rank)
    found = smallest_rank(reaches, 1, break_even)
    if found is None:
        return (break_even,), None, (f"would not shrink: no rank below {break_even + 1} keeps {energy:g} of the "
                                     f"kernel's energy")
    return (found,), fits[found], ""


@dataclass(frozen=True)
class DecompositionForm:
    """A factored form, registered in :data:`FORMS`: how it picks a layer's rank, builds the factors, and
    computes the kernel they stand for.

    ``choose(layer, rank, energy, strict, allow_growth)`` returns ``(ranks, fitted, reason)``: the ranks,
    anything fitted on the way that ``build`` can reuse, and a reason to leave the layer alone (or "").
    """

    choose: Callable[[Any, Any, float | None, bool, bool], tuple[Any, ...]]
    build: Callable[[Any, tuple[int, ...], Any], list[Factor]]
    kernel: Callable[[list[Factor]], np.ndarray]


FORMS: Registry[DecompositionForm] = Registry("decomposition form")
FORMS.register("svd", DecompositionForm(_svd_rank, lambda layer, r, _: svd_factors(layer, r[0]), svd_kernel),
               description="Dense or 1x1 Conv2D: two layers of rank r (truncated SVD).")
FORMS.register("tucker2", DecompositionForm(_tucker2_rank, lambda layer, r, _: tucker2_factors(layer, (r[0], r[1])),
                                            tucker2_kernel),
               description="Conv2D: 1x1, the kh x kw core, 1x1 (TensorLy partial_tucker on the channel modes).")
FORMS.register("cp", DecompositionForm(_cp_rank, lambda layer, r, fitted: cp_factors(layer, r[0], fitted), cp_kernel),
               description="Conv2D: 1x1, kh x 1 and 1 x kw depthwise, 1x1 (TensorLy parafac).")


def _kept(layer: Any, form: DecompositionForm, factors: list[Factor]) -> float:
    kernel = kernel_of(layer)
    approx = form.kernel(factors).reshape(kernel.shape)
    total = float(np.sum(kernel ** 2))
    return 1.0 - float(np.sum((kernel - approx) ** 2)) / total if total else 1.0


def plan_layer(layer: Any, method: DecompositionMethod, rank: Any, energy: float | None, *, shared: bool,
               allow_growth: bool, strict: bool = False) -> LayerPlan:
    """The plan of one layer: ``rank`` is this layer's (None: energy decides); errors for a bad rank.

    A rank given for this layer alone (``strict``) must not exceed the layer's; one rank for the whole
    model is capped at each layer's sizes and refused only above the largest of them.
    """
    kind = layer_kind(layer)
    form = form_of(kind, method)
    params = int(layer.count_params())
    macs = layer_macs(layer)
    row = dict(name=layer.name, kind=_describe_kind(layer), form=None, rank=None, params_before=params,
               params_after=params, macs_before=macs, macs_after=macs, energy=None)
    if form is None:
        kinds = "Dense and Conv2D" if method is not DecompositionMethod.SVD else "Dense and 1x1 Conv2D"
        return LayerPlan(**row, reason=f"{row['kind']}: method {method.value!r} factors {kinds} layers")
    reason = ""
    if shared:
        reason = "shared: the layer is called more than once"
    elif kind != "dense" and (layer.data_format != "channels_last" or layer.groups != 1):
        reason = f"data_format={layer.data_format!r}, groups={layer.groups}: only channels_last, groups=1"
    elif rank is None and energy is None:
        reason = "no rank given for this layer"
    if reason:
        return LayerPlan(**row, reason=reason)
    spec = FORMS.get(form)
    ranks, fitted, reason = spec.choose(layer, rank, energy, strict, allow_growth)
    if reason and not allow_growth:
        return LayerPlan(**dict(row, form=form, rank=ranks), reason=reason)
    factors = spec.build(layer, ranks, fitted)
    after = sum(f.params for f in factors)
    row.update(form=form, rank=ranks, params_after=after, macs_after=sum(f.macs for f in factors),
               energy=_kept(layer, spec, factors))
    if after >= params and not allow_growth:
        return LayerPlan(**dict(row, params_after=params, macs_after=macs),
                         reason=f"would not shrink: {params:,} -> {after:,} parameters at rank {_rank_text(ranks)}")
    return LayerPlan(**row, factors=tuple(factors))


def _rank_text(rank: tuple[int, ...]) -> str:
    return "x".join(str(r) for r in rank)
