"""How a layout cuts a model: its chain of layers into consecutive stages, its weights into parts.

Stages are cut at given layer indices, or balanced: the cut that makes the heaviest stage as
light as possible (the linear partition problem, solved by dynamic programming), weighing each
layer by its trainable parameter count unless told otherwise. The pipeline
(:mod:`tensorfleet.model_parallel.pipeline`) cuts its stages with :func:`partition_layers`, and the
planner's memory model (:func:`tensorfleet.planner.memory.split_stages`) estimates them the same way.

A :class:`WeightSplit` is one weight as a mesh layout holds it on a device: the mesh derives them
from its own layout decisions (:meth:`tensorfleet.model_parallel.mesh.Mesh.weight_splits`), the
planner turns them into bytes (:mod:`tensorfleet.planner.splits`). Both live here, in the lower
room: the planner plans and runs what this package executes, so the planner imports
``model_parallel`` and never the other way round.

Example:
    >>> partition_layers(list("abcde"), 2, weights=[10, 1, 1, 1, 14])
    [['a', 'b', 'c', 'd'], ['e']]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tensorfleet.validation import integer, positive_int

__all__ = ["WeightSplit", "param_count", "partition_layers"]


@dataclass(frozen=True)
class WeightSplit:
    """One weight as its layout holds it on a device.

    Args:
        parameters: the weight's elements.
        parts: how many parts the layout splits it into (1: whole on every device).
        zero_parts: how many more parts ZeRO splits its states into over the data-parallel
            replicas (1: ZeRO leaves it whole, e.g. no axis of it divides by the replicas).
        trainable: whether it has gradients and optimizer state.
    """

    parameters: int
    parts: int = 1
    zero_parts: int = 1
    trainable: bool = True

    def __post_init__(self) -> None:
        integer("parameters", self.parameters, minimum=0)
        positive_int("parts", self.parts)
        positive_int("zero_parts", self.zero_parts)


def param_count(layer: Any) -> int:
    """Number of trainable parameters of a built Keras layer."""
    return int(sum(int(v.shape.num_elements()) for v in layer.trainable_variables))


def partition_layers(layers: Sequence[Any], num_stages: int, *, boundaries: Sequence[int] | None = None,
                     weights: Sequence[float] | None = None) -> list[list[Any]]:
    """Cuts a chain of layers into ``num_stages`` consecutive, non-empty stages.

    Args:
        layers: the chain.
        num_stages: how many stages.
        boundaries: the index of the first layer of every stage after the first (for 3
            stages of 6 layers, ``[2, 4]``). If None, stages are balanced by ``weights``.
        weights: cost of each layer (default: its trainable parameter count); the cut
            minimises the largest stage total.

    Example:
        >>> partition_layers(list("abcdef"), 3, boundaries=[2, 4])
        [['a', 'b'], ['c', 'd'], ['e', 'f']]
    """
    n = len(layers)
    k = positive_int("num_stages", num_stages)
    if k > n:
        raise ValueError(f"num_stages must be at most the number of layers ({n}) so that no stage is empty. "
                         f"Received: num_stages={k}")
    if boundaries is not None:
        cuts = list(boundaries)
        if len(cuts) != k - 1 or any(not isinstance(c, int) for c in cuts) or cuts != sorted(set(cuts)) or (
                cuts and (cuts[0] <= 0 or cuts[-1] >= n)):
            raise ValueError(
                f"boundaries must be {k - 1} increasing layer indices between 1 and {n - 1} (the first layer of "
                f"each stage after the first). Received: boundaries={list(boundaries)!r}")
    else:
        w: list[float] = list(weights) if weights is not None else [param_count(layer) for layer in layers]
        cuts = _balanced_cuts(w, k)
    edges = [0, *cuts, n]
    return [list(layers[a:b]) for a, b in zip(edges, edges[1:])]


def _balanced_cuts(weights: list[float], k: int) -> list[int]:
    # Linear partition by dynamic programming: minimise the heaviest stage; ties go to the cut
    # that keeps earlier stages lighter.
    n = len(weights)
    prefix: list[float] = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for s in range(1, k + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                cost = max(best[s - 1][j], prefix[i] - prefix[j])
                if cost < best[s][i]:
                    best[s][i], cut[s][i] = cost, j
    cuts, i = [], n
    for s in range(k, 0, -1):
        i = cut[s][i]
        cuts.append(i)
    return sorted(cuts)[1:]
