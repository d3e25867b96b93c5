"""Splitting a centralised dataset into federated clients.

Four partitioners, each registered in :data:`PARTITIONERS`:

* ``iid``: a seeded shuffle cut into equal parts.
* ``dirichlet``: label skew; for every class, the class's samples are split across clients in
  proportions drawn from Dirichlet(alpha) (Hsu, Qi and Brown, "Measuring the Effects of
  Non-Identical Data Distribution for Federated Visual Classification", 2019). Small alpha,
  few labels per client.
* ``shards``: the pathological split of McMahan et al. 2017 ("Communication-Efficient Learning of
  Deep Networks from Decentralized Data"): sort by label, cut into ``num_clients * k`` shards,
  give every client ``k`` shards.
* ``quantity``: unequal client sizes; sizes in proportions drawn from Dirichlet(beta) over the
  clients, labels IID.

The index math is plain numpy (:func:`partition_indices`); :func:`partition` wraps the result in
a :class:`~tensorfleet.federated.clients.clientdata.ArrayClientData`, a real
``tff.simulation.datasets.ClientData``. Same seed, same partition.

Example:
    >>> from tensorfleet.models.datasets import load_digits
    >>> split = load_digits()
    >>> clients = partition(split.x_train, split.y_train, num_clients=10, scheme="dirichlet:0.3", seed=0)
    >>> len(clients.client_ids)
    10
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tensorfleet.registry import Registry
from tensorfleet.validation import number, positive_int

if TYPE_CHECKING:
    from tensorfleet.federated.clients.clientdata import ArrayClientData

__all__ = [
    "PARTITIONERS", "Scheme", "PartitionSpec", "parse_scheme", "partition", "partition_indices",
    "iid", "dirichlet", "shards", "quantity",
]

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partition scheme")


class Scheme(str, Enum):
    """The partition schemes that ship with tensorfleet."""

    IID = "iid"
    DIRICHLET = "dirichlet"
    SHARDS = "shards"
    QUANTITY = "quantity"


@dataclass(frozen=True)
class PartitionSpec:
    """A scheme name with its one optional parameter, parsed from ``"dirichlet:0.3"``."""

    name: str
    options: dict[str, Any]


# The parameter the ``name:value`` short form sets, per scheme.
_SHORT_PARAMETER = {"dirichlet": ("alpha", float), "shards": ("shards_per_client", int),
                    "quantity": ("beta", float)}


def parse_scheme(spec: str) -> PartitionSpec:
    """Parses ``"iid"``, ``"dirichlet:0.3"``, ``"shards:2"`` or ``"quantity:0.5"``.

    Example:
        >>> parse_scheme("dirichlet:0.3")
        PartitionSpec(name='dirichlet', options={'alpha': 0.3})
    """
    if isinstance(spec, Scheme):
        spec = spec.value
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("A partition scheme must be a non-empty string such as 'dirichlet:0.3'. Received: "
                         f"scheme={spec!r}")
    name, _, value = spec.partition(":")
    name = PARTITIONERS.canonical(name)
    if not value:
        return PartitionSpec(name, {})
    if name not in _SHORT_PARAMETER:
        raise ValueError(f"The partition scheme {name!r} takes no ':value' parameter. Received: scheme={spec!r}")
    key, kind = _SHORT_PARAMETER[name]
    try:
        parsed = kind(value)
    except ValueError:
        raise ValueError(
            f"The value after ':' in a {name!r} scheme must be {'an integer' if kind is int else 'a number'} "
            f"({key}). Received: scheme={spec!r}") from None
    return PartitionSpec(name, {key: parsed})


def _check_common(num_samples: int, num_clients: int) -> None:
    positive_int("num_clients", num_clients)
    if num_clients > num_samples:
        raise ValueError(
            f"num_clients must not exceed the number of samples ({num_samples}); every client needs at least "
            f"one sample. Received: num_clients={num_clients}")


def iid(labels: np.ndarray, num_clients: int, *, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal-sized random parts (sizes differ by at most one)."""
    order = rng.permutation(len(labels))
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, *, rng: np.random.Generator, alpha: float = 0.5,
              min_samples: int = 1) -> list[np.ndarray]:
    """Label skew with concentration ``alpha`` (smaller: fewer labels per client)."""
    number("alpha", alpha, above=0)
    if min_samples * num_clients > len(labels):
        raise ValueError(f"min_samples * num_clients must not exceed the number of samples ({len(labels)}). "
                         f"Received: min_samples={min_samples}, num_clients={num_clients}")
    classes = np.unique(labels)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for k in classes:
        members = rng.permutation(np.flatnonzero(labels == k))
        proportions = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(int)
        for client, chunk in enumerate(np.split(members, cuts)):
            parts[client].extend(chunk.tolist())
    # Clients left short take samples from the largest clients, so every client can train.
    for client in range(num_clients):
        while len(parts[client]) < min_samples:
            donor = int(np.argmax([len(p) for p in parts]))
            take = int(rng.integers(len(parts[donor])))
            parts[client].append(parts[donor].pop(take))
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def shards(labels: np.ndarray, num_clients: int, *, rng: np.random.Generator,
           shards_per_client: int = 2) -> list[np.ndarray]:
    """Sort by label, cut into ``num_clients * shards_per_client`` shards, deal them out."""
    positive_int("shards_per_client", shards_per_client)
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ValueError(
            f"num_clients * shards_per_client ({num_shards}) must not exceed the number of samples "
            f"({len(labels)}). Received: num_clients={num_clients}, shards_per_client={shards_per_client}")
    # Shuffle first so that samples of one label are not cut in dataset order.
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(order, num_shards)
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def quantity(labels: np.ndarray, num_clients: int, *, rng: np.random.Generator, beta: float = 0.5,
             min_samples: int = 1) -> list[np.ndarray]:
    """Unequal sizes in proportions from Dirichlet(``beta``) over clients; labels IID."""
    number("beta", beta, above=0)
    n = len(labels)
    if min_samples * num_clients > n:
        raise ValueError(f"min_samples * num_clients must not exceed the number of samples ({n}). "
                         f"Received: min_samples={min_samples}, num_clients={num_clients}")
    spare = n - min_samples * num_clients
    proportions = rng.dirichlet(np.full(num_clients, float(beta)))
    extra = np.floor(proportions * spare).astype(int)
    extra[np.argsort(-proportions)[: spare - int(extra.sum())]] += 1  # hand out the rounding remainder
    sizes = extra + min_samples
    order = rng.permutation(n)
    return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]


PARTITIONERS.register(Scheme.IID.value, iid, description="Seeded shuffle cut into equal parts.")
PARTITIONERS.register(Scheme.DIRICHLET.value, dirichlet, aliases=("label_skew",),
                      description="Label skew, class proportions ~ Dirichlet(alpha) (Hsu et al. 2019).")
PARTITIONERS.register(Scheme.SHARDS.value, shards, aliases=("pathological",),
                      description="Sorted by label, k shards per client (McMahan et al. 2017).")
PARTITIONERS.register(Scheme.QUANTITY.value, quantity, aliases=("quantity_skew",),
                      description="Unequal client sizes ~ Dirichlet(beta), labels IID.")


def partition_indices(labels: np.ndarray, num_clients: int, scheme: str | Scheme = "iid", *, seed: int = 0,
                      **options: Any) -> list[np.ndarray]:
    """Index arrays, one per client, for ``scheme``; numpy only.

    Args:
        labels: integer labels, shape ``(n,)``.
        num_clients: number of clients (at most ``n``).
        scheme: a registered name, optionally with its parameter (``"dirichlet:0.3"``).
        seed: the seed; the same seed gives the same partition.
        **options: the scheme's parameters (``alpha``, ``shards_per_client``, ``beta``, ...).

    Example:
        >>> parts = partition_indices(np.arange(10) % 2, 5, "shards:2", seed=1)
        >>> sorted(len(p) for p in parts)
        [2, 2, 2, 2, 2]
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional integer class ids. Received: labels.shape={labels.shape}")
    _check_common(len(labels), num_clients)
    spec = parse_scheme(scheme)
    merged = {**spec.options, **options}
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an integer. Received: seed={seed!r}")
    fn = PARTITIONERS.get(spec.name)
    try:
        return fn(labels, int(num_clients), rng=np.random.default_rng(int(seed)), **merged)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise TypeError(f"Unknown option for partition scheme {spec.name!r}: {exc}. "
                            f"Received: options={merged}") from None
        raise


def partition(x: Any, y: Any, num_clients: int, scheme: str | Scheme = "iid", *, seed: int = 0,
              **options: Any) -> "ArrayClientData":
    """Splits ``(x, y)`` into ``num_clients`` clients as a ``tff.simulation.datasets.ClientData``.

    Args:
        x: features, first axis over samples.
        y: integer labels, shape ``(n,)``.
        num_clients: number of clients, at most the number of samples.
        scheme: ``iid``, ``dirichlet`` (``alpha``), ``shards`` (``shards_per_client``) or
            ``quantity`` (``beta``); ``"dirichlet:0.3"`` sets the parameter inline.
        seed: same seed, same partition.
        **options: the scheme's parameters.

    Returns:
        An :class:`~tensorfleet.federated.clients.clientdata.ArrayClientData` whose client datasets yield
        ``OrderedDict(x=..., y=...)`` examples.

    Example:
        >>> from tensorfleet.models.datasets import load_digits
        >>> split = load_digits()
        >>> clients = partition(split.x_train, split.y_train, num_clients=100, scheme="shards:2")
        >>> int(clients.summary().samples_per_client.sum())
        1438
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same number of samples. Received: len(x)={len(x)}, len(y)={len(y)}")
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"y must hold integer class labels. Received: y.dtype={y.dtype}")
    parts = partition_indices(y, num_clients, scheme, seed=seed, **options)
    from tensorfleet.federated.clients.clientdata import ArrayClientData

    spec = parse_scheme(scheme)
    return ArrayClientData(x, y, parts, description=f"{spec.name}{spec.options or ''} {options or ''}".strip())
