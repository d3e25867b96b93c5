"""What the ``compiled`` backend runs: its algorithms and aggregators (those of the registries that
have a compiled part), and the models it refuses
before the first round (layers that mix the rows of a batch at inference; :func:`compiled_refusal`
says why, and ``backend="auto"`` then runs TFF, on the tff track).

BatchNormalization runs: each local step feeds the model the batch TFF's dataset would give, so
training normalizes over the same rows; the server takes the clients' moving statistics averaged
weighted by examples (``non_trainable="mean"``, the default) or keeps them at their initial values
as TFF's FedAvg does (``non_trainable="initial"``: its clients send trainable deltas only), with
which a BatchNormalization model ends with TFF's weights and evaluation after the same rounds
(tests/federated/backends/test_compiled.py, tff track).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["batch_dependent_layers", "compiled_aggregators", "compiled_algorithms", "compiled_refusal",
           "runs_compiled", "unsupported"]


def compiled_algorithms() -> list[str]:
    """The registered algorithms with a compiled client part (every one, today)."""
    from tensorfleet.federated.algorithms import ALGORITHMS

    return [e.name for e in ALGORITHMS.entries() if e.obj.client_work is not None]


def compiled_aggregators() -> list[str]:
    """The registered aggregators with a compiled form."""
    from tensorfleet.federated.aggregators import AGGREGATORS

    return [e.name for e in AGGREGATORS.entries() if e.obj.compiled is not None]


def runs_compiled(algorithm: str, aggregator: str | None) -> bool:
    """Whether the compiled backend has the parts of ``algorithm`` with ``aggregator`` (canonical names; None: the
    mean)."""
    return algorithm in compiled_algorithms() and (aggregator is None or aggregator in compiled_aggregators())


def unsupported(received: str) -> ValueError:
    """The error for a simulation this backend does not run; ``received`` names what was asked."""
    return ValueError(f"backend='compiled' runs {', '.join(compiled_algorithms())} with the "
                      f"{', '.join(compiled_aggregators())} aggregators on partition() client data. Received: "
                      f"{received}")


def batch_dependent_layers(model: Any, rows: np.ndarray) -> list[str]:
    """What in ``model`` makes a row's output at inference depend on the other rows of its batch.

    The model is probed in inference mode: its output for ``rows`` (a few inputs) alone and with as
    many zero rows appended must agree. (BatchNormalization passes: at inference it uses its moving
    statistics. A custom layer that mixes rows only when training is not seen by the probe.)

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> centering = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)),
        ...                                  tf.keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0))])
        >>> batch_dependent_layers(centering, np.ones((2, 3), np.float32))
        ['a layer of the model (its output for a row changes when zero rows join the batch)']
        >>> batch_dependent_layers(tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)),
        ...                                             tf.keras.layers.BatchNormalization()]),
        ...                        np.ones((2, 3), np.float32))
        []
    """
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
        return (f"a model with batch-dependent layers ({', '.join(found)}): this backend's equality with TFF is "
                f"tested on models whose rows do not mix at inference; backend='tff' or 'auto' runs it (tff track)")
    return None
