"""Model parallelism: one Keras model split across devices.

* :class:`Mesh` trains a Keras model under a Mesh-TensorFlow layout (``"b:2;m:2"``), run by
  Mesh-TF itself, by tensor-parallel Keras layers, or by DTensor: the front
  :mod:`tensorfleet.model_parallel.mesh` and one module per backend (``mesh.mtf``,
  ``mesh.keras``, ``mesh.dtensor``).
* Megatron-style tensor-parallel layers (:mod:`tensorfleet.model_parallel.tensor_parallel`).
* :class:`Pipeline`: stages, micro-batches and the GPipe, 1F1B and interleaved schedules
  (:mod:`tensorfleet.model_parallel.pipeline`: ``schedules``, ``timeline``, ``stages``,
  ``runner`` and its Keras front ``keras_model``).
* :mod:`~tensorfleet.model_parallel.chain`: a Keras model read as one chain of layers, which
  mesh layouts and pipeline stages both split.
* mesh-tensorflow 0.1.21 does not import on today's TensorFlow as shipped; once this package is
  imported, a plain ``import mesh_tensorflow`` works (or call :func:`import_mesh_tensorflow`):
  :mod:`tensorfleet.compat.mesh_tf` is the one place that imports it.

Submodules load on first use, so ``import tensorfleet.model_parallel`` touches no device and
loads no TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.compat.mesh_tf import fix_on_import, import_mesh_tensorflow
from tensorfleet.lazy import attach

fix_on_import()  # registers an import hook only; see tensorfleet.compat.mesh_tf

__getattr__, _LAZY = attach(__name__, internal=("chain", "mesh", "pipeline", "tensor_parallel"), names={
    "Mesh": "mesh", "MeshLayout": "mesh", "MeshBackend": "mesh", "MeshHistory": "mesh",
    "Pipeline": "pipeline", "Schedule": "pipeline", "bubble_fraction": "pipeline",
    "theoretical_bubble": "pipeline", "plot_schedule": "pipeline", "partition_layers": "pipeline",
    "schedule_orders": "pipeline", "peak_activations": "pipeline", "simulate_schedule": "pipeline:simulate",
    "ColumnParallelDense": "tensor_parallel", "RowParallelDense": "tensor_parallel",
    "ParallelMLP": "tensor_parallel", "ParallelSelfAttention": "tensor_parallel",
    "ParallelTransformerBlock": "tensor_parallel",
    "chain_layers": "chain",
})
if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.model_parallel.chain import chain_layers
    from tensorfleet.model_parallel.mesh import Mesh, MeshBackend, MeshHistory, MeshLayout
    from tensorfleet.model_parallel.pipeline import (
        Pipeline,
        Schedule,
        bubble_fraction,
        partition_layers,
        peak_activations,
        plot_schedule,
        schedule_orders,
        simulate as simulate_schedule,
        theoretical_bubble,
    )
    from tensorfleet.model_parallel.tensor_parallel import (
        ColumnParallelDense,
        ParallelMLP,
        ParallelSelfAttention,
        ParallelTransformerBlock,
        RowParallelDense,
    )

__all__ = [*_LAZY, "import_mesh_tensorflow"]
