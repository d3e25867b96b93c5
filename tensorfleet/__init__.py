"""tensorfleet: distributed, federated and on-device TensorFlow from plain Keras.

Subpackages are imported lazily so that ``import tensorfleet`` stays cheap and touches
no device. One subpackage per job: ``strategies`` (data parallelism), ``model_parallel``
(Mesh-TF layouts, tensor parallelism, pipelines), ``cluster`` (launching and running jobs),
``planner`` (what fits and what is fastest), ``federated``, ``edge``, ``models``, and for what
was trained: ``serving`` (a TF Serving-compatible server), ``tuning`` (distributed Keras Tuner) and
``profiling`` (where a job's step time goes).

Example:
    >>> import tensorfleet as tfl
    >>> strategy = tfl.strategies.build("one_device")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach

# Which Keras the process uses is the user's: importing tensorfleet sets no TF_USE_LEGACY_KERAS and leaves
# Keras Tuner alone. Each entry point looks at the model it receives (tensorfleet.compat.keras).

__version__ = "0.1.0"

__getattr__, _SUBPACKAGES = attach(__name__, modules=(
    "strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", "serving", "tuning",
    "profiling", "cli",
))

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet import (
        cli,
        cluster,
        edge,
        federated,
        model_parallel,
        models,
        planner,
        profiling,
        serving,
        strategies,
        tuning,
    )

__all__ = ["__version__", *_SUBPACKAGES]
