"""What the ``compiled`` backend runs: its algorithms and aggregators, and the models it refuses
before the first round (batch-dependent layers; :func:`compiled_refusal` says why, and
``backend="auto"`` then runs TFF).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorfleet.federated.backends.compiled_aggregation import ROBUST_AGGREGATORS

__all__ = ["BATCH_NORMALIZATION_CLASSES", "COMPILED_AGGREGATORS", "SUPPORTED_ALGORITHMS", "batch_dependent_layers",
           "compiled_refusal", "unsupported"]

SUPPORTED_ALGORITHMS = ("fedavg", "fedsgd", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
COMPILED_AGGREGATORS = (None, "mean", "dp_fixed", "dp_adaptive", "compression", *ROBUST_AGGREGATORS)
# Layer classes (and their subclasses, found by name in the MRO) that normalize over the batch.
BATCH_NORMALIZATION_CLASSES = ("BatchNormalizationBase", "BatchNormalization", "SyncBatchNormalization")


def unsupported(received: str) -> ValueError:
    """The error for a simulation this backend does not run; ``received`` names what was asked."""
    return ValueError(f"backend='compiled' runs {', '.join(SUPPORTED_ALGORITHMS)} with the "
                      f"{', '.join(a for a in COMPILED_AGGREGATORS if a)} aggregators on partition() client data. Received: {received}")


def batch_dependent_layers(model: Any, rows: np.ndarray) -> list[str]:
    """What in ``model`` makes a row's output depend on the other rows of its batch.

    BatchNormalization and its subclasses are named by class (anywhere in nested models); a
    model without them is probed in inference mode: its output for ``rows`` (a few real inputs)
    alone and with as many zero rows appended must agree. A custom layer that mixes rows only
    when training is not seen by the probe.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)),
        ...                              tf.keras.layers.BatchNormalization(name="bn")])
        >>> batch_dependent_layers(model, np.ones((2, 3), np.float32))
        ["BatchNormalization 'bn'"]
    """
    found = [f"{type(layer).__name__} {layer.name!r}" for layer in model.submodules
             if any(k.__name__ in BATCH_NORMALIZATION_CLASSES for k in type(layer).__mro__)]
    if found:
        return found
    rows = np.asarray(rows)
    alone = np.asarray(model(rows, training=False))
    padded = np.asarray(model(np.concatenate([rows, np.zeros_like(rows)]), training=False))[:len(rows)]
    if not np.allclose(alone, padded, rtol=1e-4, atol=1e-5):
        return ["a layer of the model (its output for a row changes when zero rows join the batch)"]
    return []


def compiled_refusal(clients: Any, model: Any = None) -> str | None:
    """Why this backend cannot give TFF's result for ``clients`` (and ``model``), or None when it can."""
    if not hasattr(clients, "arrays"):
        return f"clients={type(clients).__name__}"
    if model is None:
        return None
    if hasattr(clients, "indices"):  # in memory: a few real inputs
        rows = clients.arrays(clients.client_ids[0])[0][:4]
    else:  # made or read on request: no client is made for the probe, seeded inputs of the examples' shape
        spec = clients.element_type_structure["x"]
        rows = np.random.default_rng(0).normal(size=(4, *spec.shape)).astype(spec.dtype.as_numpy_dtype)
    found = batch_dependent_layers(model, rows)
    if found:
        return (f"a model with batch-dependent layers ({', '.join(found)}): this backend's server keeps the "
                f"trainable weights only and its equality with TFF is tested on models whose rows do not mix; "
                f"backend='tff' or 'auto' runs it")
    return None
