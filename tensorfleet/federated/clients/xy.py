"""Any client data (tensorfleet's, or TFF's own ``tff.simulation.datasets.ClientData``) as the examples a
simulation trains on: ``OrderedDict(x=..., y=...)``.

TFF's datasets name their elements for what they hold (EMNIST ``pixels``/``label``, CIFAR-100
``image``/``label``/``coarse_label``), and TFF's tutorials hand ClientData over already batched.
:func:`xy_clients` takes either as it is: the model input and the label are found by name
(:data:`FEATURE_NAMES`, :data:`LABEL_NAMES`) or given with ``x_key``/``y_key``; a ClientData whose
elements are batches (every component's first dimension unknown) is unbatched, since the
simulation batches (``batch_size``), shuffles and repeats (``local_epochs``) each client itself.
When the names cannot be told apart, one error lists the element names found. A TFF ClientData
is taken as it is (:func:`~tensorfleet.federated.clients.base.as_client_data`) and comes back as
tensorfleet's.

Example:
    >>> import collections, numpy as np, tensorflow as tf
    >>> from tensorfleet.federated.clients.base import ClientData
    >>> def dataset(cid):
    ...     return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
    ...         pixels=np.zeros((3, 4, 4), np.float32), label=np.arange(3, dtype=np.int32)))
    >>> clients = xy_clients(ClientData.from_clients_and_tf_fn(["a", "b"], dataset), x_shape=(16,))
    >>> {k: v.shape.as_list() for k, v in clients.element_type_structure.items()}
    {'x': [16], 'y': []}

On the tff track, TFF's own synthetic EMNIST:
    >>> import tensorflow_federated as tff
    >>> emnist = tff.simulation.datasets.emnist.get_synthetic()
    >>> list(emnist.element_type_structure)
    ['label', 'pixels']
    >>> clients = xy_clients(emnist)
    >>> {k: v.shape.as_list() for k, v in clients.element_type_structure.items()}
    {'x': [28, 28], 'y': []}
    >>> clients.description
    'TestClientData (pixels as x, label as y)'
    >>> batched = emnist.preprocess(lambda ds: ds.batch(4))         # as in TFF's tutorials
    >>> xy_clients(batched, x_shape=(28, 28, 1)).element_type_structure["x"].shape.as_list()
    [28, 28, 1]
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

__all__ = ["FEATURE_NAMES", "LABEL_NAMES", "is_batched", "xy_clients", "xy_keys"]

FEATURE_NAMES = ("x", "pixels", "image", "images", "features", "tokens")
LABEL_NAMES = ("y", "label", "labels")


def is_batched(element_spec: Any) -> bool:
    """Whether client examples are batches: every component has an unknown first dimension."""
    import tensorflow as tf

    leaves = tf.nest.flatten(element_spec)
    return bool(leaves) and all(s.shape.rank and s.shape[0] is None for s in leaves)


def _named(names: Sequence[str], known: Sequence[str], given: str | None, what: str) -> str | None:
    if given is not None:
        if given not in names:
            raise ValueError(f"{what}={given!r} is not an element of the client data; its elements are "
                             f"{', '.join(repr(n) for n in names)}. Received: {what}={given!r}")
        return given
    found = [n for n in known if n in names]
    return found[0] if len(found) == 1 else None


def xy_keys(element_spec: Any, *, x_key: str | None = None, y_key: str | None = None) -> tuple[Any, Any]:
    """``(x key, y key)`` of dict elements, or ``(0, 1)`` for ``(x, y)`` tuples.

    Raises:
        ValueError: the names cannot be told apart (the message lists them and asks for
            ``x_key``/``y_key``), or a given key is not an element.
        TypeError: elements that are neither a dict nor an ``(x, y)`` pair.
    """
    if isinstance(element_spec, tuple) and len(element_spec) == 2:
        if x_key is not None or y_key is not None:
            raise ValueError(f"x_key and y_key name the elements of dict examples; these examples are (x, y) pairs. "
                             f"Received: x_key={x_key!r}, y_key={y_key!r}")
        return 0, 1
    if not isinstance(element_spec, dict):
        raise TypeError(f"Client examples must be dicts of named tensors or (x, y) pairs. Received element spec: "
                        f"{element_spec}")
    names = [str(n) for n in element_spec]
    x = _named(names, FEATURE_NAMES, x_key, "x_key")
    y = _named(names, LABEL_NAMES, y_key, "y_key")
    if x is None and y is not None and len(names) == 2:
        x = next(n for n in names if n != y)
    if y is None and x is not None and len(names) == 2:
        y = next(n for n in names if n != x)
    if x is None or y is None or x == y:
        raise ValueError(f"Cannot tell the model input from the label in the client examples, whose elements are "
                         f"{', '.join(repr(n) for n in names)}. Name them: Simulation(..., x_key=NAME, y_key=NAME) "
                         f"(Received: x_key={x_key!r}, y_key={y_key!r}).")
    return x, y


def xy_clients(client_data: Any, *, x_key: str | None = None, y_key: str | None = None,
               x_shape: Sequence[int] | None = None) -> Any:
    """``client_data`` with unbatched ``OrderedDict(x=..., y=...)`` examples (itself when it has them).

    Args:
        client_data: tensorfleet's client data, or a ``tff.simulation.datasets.ClientData``.
        x_key, y_key: the element names of the model input and the label, when their names do
            not tell (see :data:`FEATURE_NAMES` and :data:`LABEL_NAMES`).
        x_shape: reshape every example's ``x`` to this shape (``(28, 28, 1)`` for a CNN on EMNIST).
    """
    import tensorflow as tf

    from tensorfleet.federated.clients.base import as_client_data

    client_data = as_client_data(client_data)
    spec = client_data.element_type_structure
    batched = is_batched(spec)
    if not batched and x_shape is None and isinstance(spec, dict) and set(spec) == {"x", "y"} and \
            x_key in (None, "x") and y_key in (None, "y"):
        return client_data
    xk, yk = xy_keys(spec, x_key=x_key, y_key=y_key)
    shape = None if x_shape is None else [int(d) for d in x_shape]

    def to_xy(*element: Any) -> Any:
        item = element if len(element) == 2 else element[0]
        x = item[xk] if shape is None else tf.reshape(item[xk], shape)
        return collections.OrderedDict(x=x, y=item[yk])

    def preprocess(ds: Any) -> Any:
        return (ds.unbatch() if batched else ds).map(to_xy)

    mapped = client_data.preprocess(preprocess)
    base = getattr(client_data, "description", "") or type(client_data).__name__
    named = "" if (xk, yk) in ((0, 1), ("x", "y")) else f"{xk} as x, {yk} as y"
    notes = [n for n in (named, "unbatched" if batched else "", f"x reshaped to {tuple(shape)}" if shape else "") if n]
    mapped.description = f"{base} ({', '.join(notes)})" if notes else base
    return mapped
