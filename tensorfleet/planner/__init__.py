"""Planning a parallel job before running it: what fits in memory and what is fastest.

* :func:`plan` ranks data, tensor, pipeline and hybrid layouts for a model on the devices at hand
  (:mod:`tensorfleet.planner.plans`; ``tfl.planner.plan`` is the function).
* :mod:`~tensorfleet.planner.memory`: per-device memory of training a model.
* :mod:`~tensorfleet.planner.cost_model`: the alpha-beta cost of collective communication.
* :mod:`~tensorfleet.planner.collectives`: the all-reduce algorithms themselves, run over
  logical devices with real tensors.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_MODULES = ("collectives", "cost_model", "memory", "plans")
_LAZY_NAMES = {"plan": "plans", "Plan": "plans", "Workload": "plans"}

__all__ = [*_LAZY_MODULES, *_LAZY_NAMES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
