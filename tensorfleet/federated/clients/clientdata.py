"""Client data in memory (tensorfleet's :class:`~tensorfleet.federated.clients.base.ClientData`), and its summary.

:class:`ArrayClientData` keeps the centralised arrays once and one index array per client, so a
client's dataset is a slice, never a copy of the whole set. Its ``serializable_dataset_fn`` is
traceable by TF and TFF (a lookup table from client id to a row range), so TFF's
``dataset_computation`` works with it as with TFF's own datasets (through
:func:`~tensorfleet.federated.clients.base.to_tff`, on the tff track).

:func:`summarize` and :func:`plot_label_distribution` take any client data, including the
ones TFF ships (``tff.simulation.datasets.emnist.get_synthetic()``).

Example:
    >>> import numpy as np
    >>> x, y = np.zeros((10, 4), np.float32), np.array([0, 1, 2, 0, 1, 2, 2, 2, 2, 2], np.int32)
    >>> clients = ArrayClientData(x, y, [np.arange(0, 5), np.arange(5, 10)])
    >>> clients.client_ids
    ['client_000', 'client_001']
    >>> print(summarize(clients))
    2 clients, 10 samples; samples per client min 5 / mean 5.0 / max 5; labels per client min 1 / mean 2.00 / max 3
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tensorfleet.federated.clients.base import ClientData
from tensorfleet.io import save_figure, write_json

__all__ = ["ArrayClientData", "PartitionSummary", "summarize", "plot_label_distribution", "label_figure",
           "client_arrays"]


class ArrayClientData(ClientData):
    """Client data over in-memory arrays with one index array per client.

    Args:
        x: features, first axis over samples.
        y: integer labels, shape ``(n,)``.
        client_indices: one integer index array per client (non-empty).
        client_ids: names of the clients; ``client_000``, ``client_001``, ... when None.
        description: free text kept with the data (the scheme that made it).

    Example:
        >>> import numpy as np
        >>> x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10, dtype=np.int32)
        >>> clients = ArrayClientData(x, y, [np.arange(0, 5), np.arange(5, 10)])
        >>> clients.arrays("client_001")[1]
        array([5, 6, 7, 8, 9], dtype=int32)
    """

    def __init__(self, x: Any, y: Any, client_indices: Sequence[np.ndarray], *,
                 client_ids: Sequence[str] | None = None, description: str = "") -> None:
        self.x = np.asarray(x)
        self.y = np.asarray(y)
        if len(self.x) != len(self.y):
            raise ValueError(f"x and y must have the same number of samples. Received: len(x)={len(self.x)}, "
                             f"len(y)={len(self.y)}")
        if not client_indices:
            raise ValueError("client_indices must hold at least one client. Received: client_indices=[]")
        self._indices = [np.asarray(ix, dtype=np.int64) for ix in client_indices]
        for i, ix in enumerate(self._indices):
            if ix.size == 0:
                raise ValueError(f"Every client needs at least one sample; client {i} has none.")
            if ix.min() < 0 or ix.max() >= len(self.x):
                raise ValueError(f"Client {i} has indices outside [0, {len(self.x)}).")
        width = max(3, len(str(len(self._indices) - 1)))
        ids = list(client_ids) if client_ids is not None else [f"client_{i:0{width}d}"
                                                               for i in range(len(self._indices))]
        if len(ids) != len(self._indices) or len(set(ids)) != len(ids):
            raise ValueError(f"client_ids must be {len(self._indices)} distinct names. Received: {len(ids)} names")
        self._ids = ids
        self._position = {cid: i for i, cid in enumerate(ids)}
        self.description = description
        self._element_spec = collections.OrderedDict(
            x=tf.TensorSpec(self.x.shape[1:], tf.as_dtype(self.x.dtype)),
            y=tf.TensorSpec((), tf.as_dtype(self.y.dtype)))
        self._serializable_fn: Any = None

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def element_type_structure(self) -> Any:
        return self._element_spec

    @property
    def num_clients(self) -> int:
        return len(self._ids)

    def indices(self, client_id: str) -> np.ndarray:
        """Row indices (into ``x``/``y``) of ``client_id``."""
        return self._indices[self._pos(client_id)]

    def arrays(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` numpy arrays of one client."""
        ix = self.indices(client_id)
        return self.x[ix], self.y[ix]

    def _pos(self, client_id: str) -> int:
        try:
            return self._position[client_id]
        except KeyError:
            raise ValueError(f"Unknown client id {client_id!r}; ids run from {self._ids[0]!r} to "
                             f"{self._ids[-1]!r}.") from None

    def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
        x, y = self.arrays(client_id)
        return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))

    @property
    def serializable_dataset_fn(self) -> Any:
        if self._serializable_fn is None:
            order = np.concatenate(self._indices)
            ends = np.cumsum([len(ix) for ix in self._indices])
            starts = ends - np.array([len(ix) for ix in self._indices])
            ids, x_all, y_all = list(self._ids), self.x, self.y

            def dataset_fn(client_id: Any) -> tf.data.Dataset:
                table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(tf.constant(ids), tf.range(len(ids), dtype=tf.int64)),
                    default_value=-1)
                pos = table.lookup(tf.convert_to_tensor(client_id, tf.string))
                rows = tf.constant(order)[tf.constant(starts)[pos]:tf.constant(ends)[pos]]
                return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
                    x=tf.gather(tf.constant(x_all), rows), y=tf.gather(tf.constant(y_all), rows)))

            self._serializable_fn = dataset_fn
        return self._serializable_fn

    def summary(self) -> "PartitionSummary":
        """Samples and distinct labels per client, and the label histogram."""
        num_classes = int(self.y.max()) + 1
        counts = np.stack([np.bincount(self.y[ix], minlength=num_classes) for ix in self._indices])
        return PartitionSummary(self.client_ids, counts, self.description)

    def __repr__(self) -> str:
        return f"ArrayClientData(num_clients={self.num_clients}, samples={sum(len(i) for i in self._indices)}, " \
               f"description={self.description!r})"


def client_arrays(client_data: Any, client_id: str, *, label_key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` arrays of one client of any client data (reads its dataset once, unless it keeps arrays)."""
    if isinstance(client_data, ArrayClientData) or (label_key is None and hasattr(client_data, "arrays")):
        return client_data.arrays(client_id)
    xs, ys = [], []
    for element in client_data.create_tf_dataset_for_client(client_id).as_numpy_iterator():
        x, y = _split_element(element, label_key)
        xs.append(x)
        ys.append(y)
    return np.stack(xs), np.asarray(ys)


def _split_element(element: Any, label_key: str | None) -> tuple[Any, Any]:
    if isinstance(element, tuple) and len(element) == 2:
        return element
    if isinstance(element, dict):
        keys = list(element)
        label = label_key or next((k for k in ("y", "label", "labels") if k in element), keys[-1])
        features = [k for k in keys if k != label]
        return element[features[0]], element[label]
    raise TypeError(f"Cannot tell features from labels in a client example of type {type(element).__name__}; "
                    f"expected (x, y) or a dict with a 'label' or 'y' key.")


@dataclass
class PartitionSummary:
    """Per-client sample and label counts of a federated dataset.

    Attributes:
        client_ids: the clients, in order.
        label_counts: ``(num_clients, num_classes)`` integer counts.
        description: how the partition was made.
    """

    client_ids: list[str]
    label_counts: np.ndarray
    description: str = ""

    @property
    def samples_per_client(self) -> np.ndarray:
        return self.label_counts.sum(axis=1)

    @property
    def labels_per_client(self) -> np.ndarray:
        return (self.label_counts > 0).sum(axis=1)

    def as_dict(self) -> dict[str, Any]:
        spc, lpc = self.samples_per_client, self.labels_per_client
        return {
            "description": self.description,
            "num_clients": len(self.client_ids),
            "num_samples": int(spc.sum()),
            "samples_per_client": {"min": int(spc.min()), "mean": float(spc.mean()), "max": int(spc.max())},
            "labels_per_client": {"min": int(lpc.min()), "mean": float(lpc.mean()), "max": int(lpc.max())},
            "clients": {cid: {"samples": int(s), "labels": int(n)}
                        for cid, s, n in zip(self.client_ids, spc, lpc)},
        }

    def __str__(self) -> str:
        d = self.as_dict()
        s, lab = d["samples_per_client"], d["labels_per_client"]
        return (f"{d['num_clients']} clients, {d['num_samples']} samples; samples per client "
                f"min {s['min']} / mean {s['mean']:.1f} / max {s['max']}; labels per client "
                f"min {lab['min']} / mean {lab['mean']:.2f} / max {lab['max']}")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes :meth:`as_dict` as JSON (atomically)."""
        return write_json(path, self.as_dict())

    def plot(self, path: str | os.PathLike[str], *, max_clients: int = 100) -> Path:
        """PNG of the label distribution across clients (stacked bars, one per client)."""
        return plot_label_distribution(self, path, max_clients=max_clients)


def summarize(client_data: Any, *, label_key: str | None = None, max_clients: int | None = None) -> PartitionSummary:
    """Summary of any ``ClientData`` (reads every client's labels once for non-array data).

    Example (on the tff track, TFF's own data):
        >>> import tensorflow_federated as tff
        >>> print(summarize(tff.simulation.datasets.emnist.get_synthetic()))
        2 clients, 20 samples; samples per client min 10 / mean 10.0 / max 10; labels per client min 10 / mean 10.00 /
        max 10
    """
    if isinstance(client_data, ArrayClientData):
        return client_data.summary()
    ids = list(client_data.client_ids)[:max_clients]
    labels = [np.asarray(client_arrays(client_data, cid, label_key=label_key)[1]).astype(np.int64).ravel()
              for cid in ids]
    num_classes = int(max(int(row.max()) for row in labels if row.size)) + 1
    counts = np.stack([np.bincount(row, minlength=num_classes) for row in labels])
    return PartitionSummary(ids, counts, getattr(client_data, "description", "") or type(client_data).__name__)


def plot_label_distribution(summary: PartitionSummary, path: str | os.PathLike[str], *, max_clients: int = 100) -> Path:
    """Stacked bar chart: samples of each label on each client, written as PNG."""
    return save_figure(label_figure(summary, max_clients=max_clients), path)


def label_figure(summary: PartitionSummary, *, max_clients: int = 100) -> Any:
    """The figure of :func:`plot_label_distribution` (one bar a client, its labels stacked)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    counts = summary.label_counts[:max_clients]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.08 * len(counts) + 4), 4))
    bottom = np.zeros(len(counts))
    cmap = plt.get_cmap("tab10" if counts.shape[1] <= 10 else "tab20")
    for label in range(counts.shape[1]):
        ax.bar(np.arange(len(counts)), counts[:, label], bottom=bottom, width=0.9, color=cmap(label % cmap.N),
               label=str(label))
        bottom += counts[:, label]
    ax.set_xlabel("client")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # a client index is an integer
    ax.set_ylabel("samples")
    shown = f" (first {len(counts)} of {len(summary.client_ids)})" if len(summary.client_ids) > len(counts) else ""
    ax.set_title(f"Label distribution across clients{shown}: {summary.description}")
    ax.legend(title="label", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize="small")
    return fig
