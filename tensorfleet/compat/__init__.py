"""The one seam between tensorfleet and other libraries' private parts and version differences.

Every reach into a private module or attribute of TensorFlow, tf_keras, Keras Tuner,
tensorflow-federated, mesh-tensorflow, dp-accounting or the profiler, and every branch on which
version of them is installed, lives in a module here, one per library:

- ``keras``: which Keras (the user's, a model's, a saved file's), each as a module; refusing Keras 3 models
  where a room runs Keras 2 only.
- ``keras3``: Keras 3's TensorFlow trainer mended for multi-worker mirrored ``fit``.
- ``keras3_checkpoints``: Keras 3's ``BackupAndRestore`` and ``ModelCheckpoint`` for several workers.
- ``keras3_ps``: a Keras 3 model's step-time updates (step count, seed generators, BatchNorm) atomic under a
  parameter server.
- ``keras3_metrics``: Keras 3's metrics under central storage, made what one device logs.
- ``tf_keras``: tf_keras internals the mesh needs (call context, layout-map scope, attention parts ...).
- ``distribute``: ``tf.distribute`` internals (the cluster coordinator's queue, collective keys).
- ``mesh_tf``: importing mesh-tensorflow on today's TensorFlow.
- ``keras_tuner``: Keras Tuner on tf_keras, and its oracle's internals.
- ``tff``: whether tensorflow-federated can be imported, and its private executors.
- ``dp``: dp-accounting's internals.
- ``profiler``: the profiler's XSpace converter, wherever the installed release keeps it.
- ``litert``: the TFLite interpreter (``ai_edge_litert``, or ``tflite_runtime`` on the tff track).

The rest of the package imports these names, never the private ones: ``tests/test_compat.py``
reads every module's syntax tree to hold that.
"""

from __future__ import annotations

from tensorfleet.lazy import attach

__getattr__, _SUBMODULES = attach(__name__, modules=(
    "keras", "keras3", "keras3_metrics", "tf_keras", "distribute", "mesh_tf", "keras_tuner", "tff", "dp", "profiler",
    "litert",
))

__all__ = list(_SUBMODULES)
