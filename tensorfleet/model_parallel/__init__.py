"""Model parallelism: one Keras model split across devices.

* :class:`Mesh` trains a Keras model under a Mesh-TensorFlow layout (``"b:2;m:2"``), run by
  Mesh-TF itself, by tensor-parallel Keras layers, or by DTensor
  (:mod:`tensorfleet.model_parallel.mesh`).
* Megatron-style tensor-parallel layers (:mod:`tensorfleet.model_parallel.tensor_parallel`).
* :class:`Pipeline`: stages, micro-batches and the GPipe, 1F1B and interleaved schedules
  (:mod:`tensorfleet.model_parallel.pipeline`).

Submodules load on first use, so ``import tensorfleet.model_parallel`` touches no device.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_MODULES = ("mesh", "mtf_compat", "pipeline", "tensor_parallel")
_LAZY_NAMES = {
    "Mesh": "mesh", "MeshLayout": "mesh", "MeshBackend": "mesh", "MeshHistory": "mesh",
    "Pipeline": "pipeline", "Schedule": "pipeline", "bubble_fraction": "pipeline",
    "theoretical_bubble": "pipeline", "plot_schedule": "pipeline", "partition_layers": "pipeline",
    "ColumnParallelDense": "tensor_parallel", "RowParallelDense": "tensor_parallel",
    "ParallelMLP": "tensor_parallel", "ParallelSelfAttention": "tensor_parallel",
    "ParallelTransformerBlock": "tensor_parallel",
    "import_mesh_tensorflow": "mtf_compat",
}

__all__ = [*_LAZY_MODULES, *_LAZY_NAMES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
