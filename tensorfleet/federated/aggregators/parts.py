"""An aggregator as a registered part: :class:`Aggregator` (the registry's record) and
:class:`AggregatorPart` (its compiled form, what the compiled backend's round calls).

Every entry of :data:`~tensorfleet.federated.aggregators.AGGREGATORS` is an :class:`Aggregator`:
its options and their defaults, the factory of its compiled form, and (where TFF has one) the
factory of its TFF form. The compiled round trains the clients, hands each client's flat update to
the part's :meth:`AggregatorPart.client` (in the graph), collects the values (summed, or kept as
rows ``[clients, d]`` when the part says ``rows``), and asks :meth:`AggregatorPart.aggregate` for the
server's update, the part's next state and its metrics. A part that says ``host`` aggregates in
Python, between the compiled client work and the compiled server step (the secure aggregators do).

After TFF's ``tff.aggregators`` factories (``create(value_type) -> AggregationProcess`` with
``initialize``/``next``), Flower's strategies (aggregate math as pure functions) and optax's
``(init, update)`` pairs.

Example (a part of one's own: the mean of the updates' signs, run by the compiled round):
    >>> import numpy as np
    >>> class SignMean(AggregatorPart):
    ...     rows = True
    ...     def client(self, update, weight, state, ctx):
    ...         import tensorflow as tf
    ...         return tf.sign(update), self.no_aux(update)
    ...     def aggregate(self, state, updates, ctx):
    ...         import tensorflow as tf
    ...         count = tf.cast(tf.maximum(updates.participants, 1), tf.float32)
    ...         return Aggregate(tf.reduce_sum(updates.values, 0) / count, state, {})
    >>> entry = Aggregator(compiled=lambda clients_per_round, seed: SignMean())
    >>> entry.options()
    []
    >>> isinstance(entry.part(clients_per_round=4, seed=0, options={}), AggregatorPart)
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from tensorfleet.validation import UnknownOptionError

__all__ = ["Aggregate", "AggregationError", "Aggregator", "AggregatorPart", "ClientUpdates", "RoundContext",
           "clip_rows", "gaussian_noise", "too_few_clients"]


class AggregationError(ValueError):
    """A round's aggregation cannot produce an update (for example fewer survivors than a secure
    aggregator's threshold): the round is not applied, the model stays as it was."""


class Aggregate(NamedTuple):
    """What :meth:`AggregatorPart.aggregate` returns.

    Attributes:
        update: the server's update, flat ``[d]`` float32, with the sign of the clients' updates
            (``initial - trained``): the server optimizer applies it.
        state: the part's next state (the keys, shapes and dtypes of :meth:`AggregatorPart.initial_state`).
        metrics: scalars recorded in the round's history as ``aggregator_<key>``.
    """

    update: Any
    state: dict[str, Any]
    metrics: dict[str, Any]


class ClientUpdates(NamedTuple):
    """The round's client values as :meth:`AggregatorPart.aggregate` receives them.

    Attributes:
        values: rows ``[clients_per_round, d]`` (a part with ``rows``; empty slots are zeros), their
            sum ``[d]`` (a part without), or a NumPy ``[participants, d]`` (a ``host`` part).
        aux: the clients' aux vectors, kept or summed alike (``[..., aux_size]``).
        weights: the clients' weights (examples trained on; 0 for an empty slot or a non-finite
            update): ``[clients_per_round]``, their sum, or NumPy ``[participants]``.
        participants: how many slots hold a client (the first ones).
        client_ids: the participants' ids in row order (``host`` parts; else empty).
    """

    values: Any
    aux: Any
    weights: Any
    participants: Any
    client_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class RoundContext:
    """The round a part aggregates.

    Attributes:
        round_num: the round (an int64 scalar tensor in the graph, a Python int in a ``host`` part).
        seed: the simulation's seed.
        clients_per_round: the round's client slots.
        sizes: the sizes of the model's trainable tensors, in the order of a flat update.
    """

    round_num: Any
    seed: int
    clients_per_round: int
    sizes: tuple[int, ...]

    def rng(self, stream: int = 0) -> np.random.Generator:
        """A generator for ``host`` parts, drawn from the seed, the round and ``stream`` (a resumed run
        draws what an uninterrupted one did)."""
        return np.random.default_rng([self.seed, int(self.round_num), 0x5EC, int(stream)])

    def split(self, flat: Any) -> list[Any]:
        """A flat ``[..., d]`` (tensor or array) as one piece per trainable tensor, along its last axis."""
        if isinstance(flat, np.ndarray):
            return np.split(flat, np.cumsum(self.sizes)[:-1], axis=-1)
        import tensorflow as tf

        return tf.split(flat, list(self.sizes), axis=-1)


class AggregatorPart:
    """The compiled form of an aggregator (subclass it; every method has a default but ``aggregate``).

    Attributes:
        rows: True: :meth:`aggregate` gets every client's value as a row ``[clients_per_round, d]``
            (robust rules, compression); False: their sum, which the round keeps without ever holding
            every row (the mean, DP).
        host: True: :meth:`aggregate` runs in Python on NumPy arrays (implies ``rows``), between the
            compiled client work and the compiled server step; when it raises, the round is not applied.
        aux_size: the length of the aux vector :meth:`client` returns per client.
    """

    rows: bool = False
    host: bool = False
    aux_size: int = 0

    def initial_state(self) -> dict[str, np.ndarray]:
        """The part's state before the first round (checkpointed with the model; fixed keys and shapes)."""
        return {}

    def no_aux(self, update: Any) -> Any:
        """A zero aux vector of ``aux_size`` (in the graph)."""
        import tensorflow as tf

        return tf.zeros([self.aux_size], update.dtype)

    def check_size(self, size: int) -> None:
        """Called once the model is built, before the first round's client work: each client's flat update
        holds ``size`` values. Raise ValueError (naming the option to change) when this part cannot
        aggregate updates of that size; the default takes any."""

    def client(self, update: Any, weight: Any, state: dict[str, Any], ctx: RoundContext) -> tuple[Any, Any]:
        """One client's ``(value [d], aux [aux_size])`` in the graph, from its flat ``update``
        (``initial - trained``; a non-finite one comes as zeros with weight 0) and ``weight`` (the
        examples it trained on, 0 for an empty slot). Default: ``weight * update``."""
        return weight * update, self.no_aux(update)

    def aggregate(self, state: dict[str, Any], updates: ClientUpdates, ctx: RoundContext) -> Aggregate:
        """The server's update, the next state and the round's metrics."""
        raise NotImplementedError(f"{type(self).__name__} must define aggregate(state, updates, ctx)")


@dataclass(frozen=True)
class Aggregator:
    """A registered aggregator (an entry of :data:`~tensorfleet.federated.aggregators.AGGREGATORS`).

    Attributes:
        compiled: ``(clients_per_round, seed, **options) -> AggregatorPart``; cheap, no TensorFlow:
            it checks the options' values (ValueError naming the option) and is called when a
            simulation's configuration is made (what depends on the model's size, when the
            simulation starts: :meth:`AggregatorPart.check_size`).
        tff: ``(clients_per_round, **options) -> tff.aggregators factory`` for the ``tff`` backend,
            or None when only the compiled backend runs it.
        defaults: every option and its default (an option not here is refused).
        dp: whether the simulation reports epsilon, from the ``noise_multiplier`` option (``inf`` at
            0), accounted as central Gaussian noise of ``noise_multiplier * clip`` on the sum: True,
            or a function of the options (every option, defaults included) saying whether they add noise.
        upload_bytes: ``(sizes, options) -> bytes`` one client uploads; None: float32 values.
        paper: where the rule comes from.
        min_clients: the fewest clients a round needs: a number, or a function of the options (every
            option, defaults included); None: the fewest ``clients_per_round`` the compiled form's
            factory accepts (found by asking it, from 1 up to 64).
        min_clients_rule: why, formatted with the options (``"n > 2 * {num_byzantine} + 2"``).
    """

    compiled: Callable[..., AggregatorPart] | None
    tff: Callable[..., Any] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    dp: bool | Callable[[dict[str, Any]], bool] = False
    upload_bytes: Callable[[list[int], dict[str, Any]], int] | None = None
    paper: str = ""
    min_clients: int | Callable[[dict[str, Any]], int] | None = None
    min_clients_rule: str = ""

    def options(self) -> list[str]:
        """The option names this aggregator takes."""
        return list(self.defaults)

    def given(self, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """Every option: the defaults updated with ``options``; TypeError naming an option it does not take."""
        for key in options:
            if key not in self.defaults:
                raise UnknownOptionError(f"Aggregator {name!r} takes no option {key!r} (its options: "
                                f"{', '.join(self.defaults) or 'none'}). Received: {key}={options[key]!r}")
        return {**self.defaults, **options}

    def part(self, *, clients_per_round: int, seed: int, options: dict[str, Any],
             name: str = "aggregator") -> AggregatorPart:
        """The compiled form for these options."""
        if self.compiled is None:
            raise ValueError(f"Aggregator {name!r} has no compiled form; backend='tff' runs it.")
        return self.compiled(clients_per_round=clients_per_round, seed=seed, **self.given(name, options))

    def fewest_clients(self, options: dict[str, Any]) -> tuple[int, str]:
        """``(fewest clients a round needs, why)`` with ``options`` (see ``min_clients``)."""
        given = {**self.defaults, **options}
        if self.min_clients is not None:
            fewest = self.min_clients(given) if callable(self.min_clients) else self.min_clients
            return int(fewest), self.min_clients_rule.format(**given)
        if self.compiled is None:
            return 1, ""
        for clients in range(1, 65):
            try:
                self.compiled(clients_per_round=clients, seed=0, **given)
            except (ValueError, TypeError):
                continue
            return clients, "" if clients == 1 else "the fewest clients_per_round its compiled form accepts"
        return 1, ""  # no count is accepted: its options are wrong, and making it says so

    def bytes_per_client(self, sizes: list[int], options: dict[str, Any]) -> int:
        """Bytes one client uploads for tensors of ``sizes``."""
        if self.upload_bytes is None:
            return 4 * int(sum(sizes))
        return int(self.upload_bytes(list(sizes), {**self.defaults, **options}))


def too_few_clients(name: str, fewest: int, rule: str, what: str, count: int) -> ValueError:
    """The error for a round (or configuration) that gives aggregator ``name`` ``count`` clients, fewer
    than its ``fewest`` (``what`` names the count: ``clients_per_round``, ``participants``).

    Example:
        >>> too_few_clients("krum", 5, "n > 2 * num_byzantine + 2 with num_byzantine=1", "clients_per_round", 4)
        ValueError("Aggregator 'krum' needs at least 5 clients (n > 2 * num_byzantine + 2 with num_byzantine=1).
        Received: clients_per_round=4")
    """
    why = f" ({rule})" if rule else ""
    return ValueError(f"Aggregator {name!r} needs at least {fewest} clients{why}. Received: {what}={count}")


def clip_rows(rows: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Every row scaled to L2 norm at most ``clip`` (``tf.clip_by_global_norm``'s rule);
    ``(clipped rows, their norms before clipping)``.

    Example:
        >>> clipped, norms = clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0)
        >>> clipped.round(6).tolist(), norms.tolist()
        ([[0.6, 0.8], [0.3, 0.4]], [5.0, 0.5])
    """
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1)
    scale = np.where(norms > clip, clip / np.where(norms > 0, norms, 1.0), 1.0)
    return rows * scale[:, None], norms


def gaussian_noise(shape: Any, stddev: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise of ``stddev`` (float64) drawn from ``rng``: DP's noise added once, centrally."""
    return rng.normal(0.0, float(stddev), size=shape)
