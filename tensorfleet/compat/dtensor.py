"""DTensor internals the multi-process mesh needs (:mod:`tensorfleet.model_parallel.mesh.clients`).

``tf.experimental.dtensor`` exports ``initialize_accelerator_system`` but not whether it has run;
a second call raises. TensorFlow keeps that in ``tensorflow.dtensor.python.accelerator_util``.
"""

from __future__ import annotations

__all__ = ["accelerator_initialized"]


def accelerator_initialized() -> bool:
    """Whether ``dtensor.initialize_accelerator_system`` has run in this process."""
    from tensorflow.dtensor.python import accelerator_util

    return bool(accelerator_util.is_initialized())
