"""Model decomposition: Dense and convolution layers replaced by their low-rank factors.

:func:`plan_decomposition` decides, layer by layer, the form (``svd`` for Dense and 1x1 Conv2D,
``tucker2`` or ``cp`` for kh x kw Conv2D), the rank and the change in parameters and FLOPs,
without changing anything; layers that would grow, and layers no form fits, are left alone with
the reason. :func:`decompose` builds the plan (or takes one) and returns a new plain Keras model
(functional or Sequential, as the original) in which each planned layer is replaced by its
factors, ready for ``fit``, :func:`tensorfleet.edge.finetune`, QAT and :func:`tensorfleet.edge.convert`.
The factors are separate layers, so the converted ``.tflite`` keeps them as separate
FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D operators.

FLOPs count a multiply-accumulate as two operations.

Example:
    >>> plan = plan_decomposition(model, "tucker2", energy=0.9)    # doctest: +SKIP
    >>> print(plan.describe())                                       # doctest: +SKIP
    >>> small = decompose(model, plan=plan)                          # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorfleet.compat.keras import module_of
from tensorfleet.edge.decompose_factors import layer_kind, weight_kernel
from tensorfleet.edge.decompose_plan import DecompositionMethod, LayerPlan, form_of, plan_layer
from tensorfleet.edge.errors import DecompositionError
from tensorfleet.io import save_figure
from tensorfleet.testing.hooks import active
from tensorfleet.validation import choice, number

__all__ = ["DecompositionMethod", "LayerPlan", "DecompositionPlan", "plan_decomposition", "decompose", "save_keras"]


@dataclass(frozen=True)
class DecompositionPlan:
    """What :func:`decompose` will do to a model, layer by layer (see :func:`plan_decomposition`)."""

    model_name: str
    method: str
    layers: tuple[LayerPlan, ...]
    model_params: int

    @property
    def decomposed(self) -> tuple[LayerPlan, ...]:
        return tuple(row for row in self.layers if row.decomposed)

    @property
    def params_after(self) -> int:
        return self.model_params - sum(r.params_before - r.params_after for r in self.layers)

    def _totals(self) -> tuple[int, int]:
        return sum(r.macs_before for r in self.layers), sum(r.macs_after for r in self.layers)

    def as_dict(self) -> dict[str, Any]:
        before, after = self._totals()
        return {"model": self.model_name, "method": self.method, "params_before": self.model_params,
                "params_after": self.params_after, "flops_before": 2 * before, "flops_after": 2 * after,
                "layers": [row.as_dict() for row in self.layers]}

    def describe(self) -> str:
        """The plan as a table: one row per layer with a kernel, then the model's totals."""
        head = (f"{'layer':<22} {'kind':<15} {'form':<8} {'rank':<9} {'params':>17} {'FLOPs':>23} "
                f"{'kept':>6}  note")
        lines = [f"decomposition plan for {self.model_name!r} (method {self.method})", head, "-" * len(head)]
        for r in self.layers:
            rank = "x".join(str(v) for v in r.rank) if r.rank else "-"
            params = f"{r.params_before:,} -> {r.params_after:,}"
            flops = f"{2 * r.macs_before:,} -> {2 * r.macs_after:,}"
            kept = f"{r.energy:.3f}" if r.energy is not None and r.decomposed else "-"
            note = "factored" if r.decomposed else f"left alone: {r.reason}"
            lines.append(f"{r.name:<22} {r.kind:<15} {r.form or '-':<8} {rank:<9} {params:>17} {flops:>23} "
                         f"{kept:>6}  {note}")
        before, after = self._totals()
        lines.append("-" * len(head))
        ratio = f"{self.model_params / self.params_after:.2f}x fewer" if self.params_after else ""
        lines.append(f"model parameters {self.model_params:,} -> {self.params_after:,} ({ratio}); FLOPs of these "
                     f"layers {2 * before:,} -> {2 * after:,} ({before / max(after, 1):.2f}x fewer); "
                     f"{len(self.decomposed)} of {len(self.layers)} layers factored")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """A PNG with parameters and FLOPs per layer, before and after."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        names = [r.name for r in self.layers]
        y = np.arange(len(names))
        fig, axes = plt.subplots(1, 2, figsize=(12, max(3.0, 0.35 * len(names) + 1.5)), sharey=True)
        for ax, before, after, title in [
            (axes[0], [r.params_before for r in self.layers], [r.params_after for r in self.layers], "parameters"),
            (axes[1], [2 * r.macs_before for r in self.layers], [2 * r.macs_after for r in self.layers],
             "FLOPs per example"),
        ]:
            ax.barh(y - 0.2, before, height=0.4, label="before", color="tab:gray")
            ax.barh(y + 0.2, after, height=0.4, label="after", color="tab:blue")
            ax.set_title(title)
            ax.grid(axis="x", alpha=0.3)
            ax.legend(loc="lower right", fontsize=8)
        axes[0].set_yticks(y, names, fontsize=8)
        axes[0].invert_yaxis()
        fig.suptitle(f"{self.model_name}: {self.method}, parameters {self.model_params:,} -> {self.params_after:,}")
        return save_figure(fig, path)


def _check_model(model: Any, where: str) -> Any:
    """The config of a functional or Sequential model of either Keras, from which its decomposed twin is built in
    the same Keras (the factors are layers of the model's own Keras module)."""
    try:
        keras = module_of(model, where)
    except TypeError as error:
        raise DecompositionError(str(error)) from None
    if not isinstance(model, keras.Model):
        raise DecompositionError(f"{where} needs a Keras model (Keras 3 or tf_keras). Received: {type(model).__name__}")
    config = model.get_config() if isinstance(model, keras.Sequential) or _is_functional(model) else None
    if config is None or "layers" not in config:
        raise DecompositionError(f"{where} needs a functional or Sequential Keras model (their config lists the "
                                 f"layers); a subclassed model cannot be rebuilt. Received: {type(model).__name__}")
    return config


def _is_functional(model: Any) -> bool:
    try:
        config = model.get_config()
    except NotImplementedError:
        return False
    return isinstance(config, dict) and "input_layers" in config and "output_layers" in config


def _shared(config: dict[str, Any]) -> set[str]:
    return {entry["name"] for entry in config["layers"] if len(entry.get("inbound_nodes") or []) > 1}


def _layer_rank(rank: Any, name: str) -> Any:
    return rank.get(name) if isinstance(rank, dict) else rank


def plan_decomposition(model: Any, method: str | DecompositionMethod = "svd", *, rank: Any = None,
                       energy: float | None = None, layers: list[str] | None = None) -> DecompositionPlan:
    """The per-layer plan of :func:`decompose`, computed without changing the model.

    Args:
        model: a functional or Sequential Keras model, Keras 3 or tf_keras (the decomposed model is of the same Keras).
        method: ``svd`` (Dense and 1x1 Conv2D), ``tucker2`` or ``cp`` (kh x kw Conv2D; Dense and
            1x1 Conv2D then take the svd form).
        rank: an int (one rank for the whole model: capped at each layer's sizes), ``(r_in, r_out)``
            for tucker2, ``"vbmf"`` (svd, tucker2), or a dict of those by layer name (other layers are
            left alone; a rank above its layer's is an error).
        energy: instead of ``rank``, the share of the kernel's energy to keep, in (0, 1].
        layers: only these layers (by name); each must be one the method factors.

    A layer whose factors would have as many parameters as it has, or more, is left alone, with the reason
    (tensorfleet's own tests factor it anyway, at full rank, under :func:`tensorfleet.testing.allow_growth`).

    Example:
        >>> print(plan_decomposition(model, "svd", energy=0.9).describe())   # doctest: +SKIP
    """
    config = _check_model(model, "tfl.edge.decompose")
    method = choice(DecompositionMethod, "method", method)
    if (rank is None) == (energy is None):
        raise DecompositionError(f"Pass exactly one of rank= or energy=. Received: rank={rank!r}, energy={energy!r}")
    if energy is not None:
        energy = number("energy", energy, above=0, maximum=1)
    by_name = {layer.name: layer for layer in model.layers}
    chosen = _chosen_layers(model, method, layers, rank, by_name)
    shared = _shared(config)
    rows = tuple(plan_layer(layer, method, _layer_rank(rank, layer.name), energy, shared=layer.name in shared,
                            allow_growth=active().allow_growth, strict=isinstance(rank, dict))
                 for layer in model.layers if weight_kernel(layer) is not None and layer in chosen)
    return DecompositionPlan(model.name, method.value, rows, int(model.count_params()))


def _chosen_layers(model: Any, method: DecompositionMethod, layers: list[str] | None, rank: Any,
                   by_name: dict[str, Any]) -> list[Any]:
    names = list(layers) if layers is not None else None
    if isinstance(rank, dict):
        unknown = [n for n in rank if n not in by_name]
        if unknown:
            raise DecompositionError(f"rank names layers the model does not have: {unknown}. "
                                     f"Layers: {', '.join(by_name)}")
    if names is not None:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise DecompositionError(f"Unknown layer name(s) {unknown}. Layers: {', '.join(by_name)}")
        for name in names:
            if form_of(layer_kind(by_name[name]), method) is None:
                raise DecompositionError(
                    f"layer {name!r} is a {type(by_name[name]).__name__}, which method {method.value!r} does not "
                    f"factor: svd takes Dense and 1x1 Conv2D, tucker2 and cp take Conv2D (and Dense by svd). "
                    f"Received: layers={names!r}")
        return [by_name[n] for n in names]
    candidates = [layer for layer in model.layers if form_of(layer_kind(layer), method) is not None]
    if not candidates:
        raise DecompositionError(f"model {model.name!r} has no layer that method {method.value!r} factors (Dense or "
                                 f"1x1 Conv2D for svd; Conv2D or Dense for tucker2 and cp). Layers: "
                                 f"{', '.join(f'{la.name} ({type(la).__name__})' for la in model.layers)}")
    return list(model.layers)


def _rewire(obj: Any, renames: dict[str, str]) -> Any:
    """``obj`` (a layer's inbound nodes) with references to a replaced layer pointing at its last factor."""
    if isinstance(obj, (list, tuple)):  # Keras 3 keeps a node's args as a tuple, its keras_history as a list
        if len(obj) >= 3 and isinstance(obj[0], str) and isinstance(obj[1], int) and obj[0] in renames:
            return type(obj)([renames[obj[0]], *obj[1:]])
        return type(obj)(_rewire(item, renames) for item in obj)
    if isinstance(obj, dict):
        return {key: _rewire(value, renames) for key, value in obj.items()}
    return obj


def _factored_config(config: dict[str, Any], plan: DecompositionPlan, sequential: bool) -> dict[str, Any]:
    factored = {row.name: row.factors for row in plan.decomposed}
    renames = {name: factors[-1].config["config"]["name"] for name, factors in factored.items()}
    entries = []
    for entry in config["layers"]:
        name = entry["config"]["name"]
        if name not in factored:
            entries.append(entry if sequential else dict(entry, inbound_nodes=_rewire(entry["inbound_nodes"], renames)))
            continue
        inbound = None if sequential else _rewire(entry["inbound_nodes"], renames)
        for factor in factored[name]:
            new = dict(factor.config)
            if not sequential:
                new.update(name=new["config"]["name"], inbound_nodes=inbound)
                inbound = [[[new["name"], 0, 0, {}]]]
            entries.append(new)
    out = dict(config, layers=entries)
    if not sequential:
        out["output_layers"] = _rewire(config["output_layers"], renames)
    return out


def _apply(model: Any, plan: DecompositionPlan) -> Any:

    config = _check_model(model, "tfl.edge.decompose")
    sequential = isinstance(model, module_of(model).Sequential)
    names = {layer.name for layer in model.layers}
    missing = [row.name for row in plan.decomposed if row.name not in names]
    if missing or plan.model_name != model.name:
        raise DecompositionError(f"the plan was made for model {plan.model_name!r} with layers {missing or '...'} "
                                 f"that this model ({model.name!r}) does not have; plan this model")
    clashes = {f.config["config"]["name"] for row in plan.decomposed for f in row.factors} & names
    if clashes:
        raise DecompositionError(f"the model already has layers named like the factors: {sorted(clashes)}; "
                                 "rename them first")
    custom = {type(layer).__name__: type(layer) for layer in model.layers}
    new = type(model).from_config(_factored_config(config, plan, sequential), custom_objects=custom)
    replaced = {row.name for row in plan.decomposed}
    for layer in model.layers:
        if layer.name not in replaced and layer.weights:
            new.get_layer(layer.name).set_weights(layer.get_weights())
    for row in plan.decomposed:
        for factor in row.factors:
            new.get_layer(factor.config["config"]["name"]).set_weights(list(factor.weights))
    return new


def decompose(model: Any, method: str | DecompositionMethod = "svd", *, rank: Any = None, energy: float | None = None,
              layers: list[str] | None = None, plan: DecompositionPlan | None = None,
              show_plan: bool = False) -> Any:
    """A new Keras model in which the planned layers are replaced by their low-rank factors.

    Takes the arguments of :func:`plan_decomposition`, or a ``plan`` made by it for this model. The
    original model is not changed. Recompile the result before ``fit``.

    Raises:
        DecompositionError: a rank above a layer's, a layer kind no method factors, or no layer to
            factor (the plan's reasons are in the message).

    Example:
        >>> small = decompose(model, "svd", energy=0.9, show_plan=True)   # doctest: +SKIP
        >>> small.count_params() < model.count_params()                    # doctest: +SKIP
        True
    """
    if plan is None:
        plan = plan_decomposition(model, method, rank=rank, energy=energy, layers=layers)
    elif not isinstance(plan, DecompositionPlan):
        raise TypeError(f"plan must be a DecompositionPlan. Received: {type(plan).__name__}")
    if show_plan:
        print(plan.describe())
    if not plan.decomposed:
        reasons = "; ".join(f"{row.name}: {row.reason}" for row in plan.layers)
        raise DecompositionError(f"no layer of model {plan.model_name!r} is worth factoring with method "
                                 f"{plan.method!r} ({reasons}); pass a smaller rank or energy")
    return _apply(model, plan)


def save_keras(model: Any, path: str | os.PathLike[str]) -> Path:
    """Saves ``model`` as a ``.keras`` file atomically: nothing is left at ``path`` if saving fails."""
    import tempfile

    from tensorfleet.io import write_bytes

    target = Path(path)
    if target.suffix != ".keras":
        raise DecompositionError(f"the decomposed model is saved in the .keras format; name the file *.keras. "
                                 f"Received: {str(target)!r}")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / target.name
        model.save(staged)
        return write_bytes(target, staged.read_bytes())
