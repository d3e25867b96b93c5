"""DTensor internals the multi-process mesh needs (:mod:`tensorfleet.model_parallel.mesh.clients`).

``tf.experimental.dtensor`` exports ``initialize_accelerator_system`` but not whether it has run;
a second call raises. TensorFlow keeps that in ``tensorflow.dtensor.python.accelerator_util``.
"""

from __future__ import annotations

__all__ = ["accelerator_initialized", "other_client"]


def accelerator_initialized() -> bool:
    """Whether ``dtensor.initialize_accelerator_system`` has run in this process."""
    from tensorflow.dtensor.python import accelerator_util

    return bool(accelerator_util.is_initialized())


def other_client() -> bool:
    """Whether this process is a DTensor client other than the first of a mesh across processes: a process that
    gathers every value as the first one does (a collective) but whose files the first one writes."""
    if not accelerator_initialized():
        return False
    from tensorflow.experimental import dtensor

    return dtensor.num_clients() > 1 and dtensor.client_id() != 0
