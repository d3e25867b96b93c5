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

import logging
import os

from tensorfleet.lazy import attach

# TensorFlow >= 2.16 serves Keras 3 as ``tf.keras`` unless told otherwise; every room here (and
# tfmot, TFF) targets the Keras 2 API, which tf_keras provides. Chosen before TensorFlow reads it, so
# a user's ``tf.keras.Sequential`` is a model every room takes; a value the user set wins.
if "TF_USE_LEGACY_KERAS" not in os.environ:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    logging.getLogger(__name__).info("tensorfleet: TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras, the Keras 2 API)")
else:
    logging.getLogger(__name__).info("tensorfleet: TF_USE_LEGACY_KERAS=%s, as set before import",
                                     os.environ["TF_USE_LEGACY_KERAS"])

# Keras Tuner decides once, as it loads, which Keras it drives, and takes Keras 3 whenever that is
# installed (it is, beside TensorFlow >= 2.16); a finder (standard library only) makes a Keras Tuner
# imported after this one drive tf_keras too, so a user's own `import keras_tuner` takes their models.
from tensorfleet.compat.keras_tuner import prefer_keras2  # noqa: E402

prefer_keras2()

__version__ = "0.1.0"

__getattr__, _SUBPACKAGES = attach(__name__, modules=(
    "strategies", "model_parallel", "cluster", "planner", "federated", "edge", "models", "serving", "tuning",
    "profiling", "cli",
))

__all__ = ["__version__", *_SUBPACKAGES]
