"""What a round records besides its training metrics, from the configuration alone: the privacy
spent (:func:`round_epsilon`), the bytes clients upload (:func:`upload_bytes`), and the check that
a round's participants are enough for its aggregator (:func:`check_participants`).

Example:
    >>> from tensorfleet.federated.config import SimulationConfig
    >>> config = SimulationConfig(clients_per_round=5, aggregator="dp_fixed",
    ...                           aggregator_options={"noise_multiplier": 2.0})
    >>> round(round_epsilon(config, num_clients=20, rounds_done=3), 3)
    5.251
    >>> upload_bytes(SimulationConfig(aggregator="compression", aggregator_options={"bits": 8}), [100, 10])
    126
"""

from __future__ import annotations

from typing import Any, Sequence

from tensorfleet.federated.aggregators.parts import too_few_clients

__all__ = ["check_participants", "is_dp", "round_epsilon", "sent_sizes", "upload_bytes"]


def _entry(config: Any) -> Any:
    """The registered aggregator of ``config`` (None: the mean, or a TFF factory given as it is)."""
    from tensorfleet.federated.aggregators import AGGREGATORS

    name = config.aggregator_name
    return AGGREGATORS.get(name) if name is not None and name in AGGREGATORS else None


def is_dp(config: Any) -> bool:
    """Whether ``config``'s aggregator adds DP noise the simulation accounts (``Aggregator.dp``)."""
    entry = _entry(config)
    if entry is None:
        return False
    return bool(entry.dp({**entry.defaults, **config.aggregator_options}) if callable(entry.dp) else entry.dp)


def round_epsilon(config: Any, *, num_clients: int, rounds_done: int) -> float | None:
    """The epsilon (at ``config.dp_delta``) after ``rounds_done`` rounds; None without a DP aggregator.

    Accounted as simulated: ``clients_per_round`` of ``num_clients`` drawn without replacement
    (:func:`tensorfleet.federated.aggregators.dp.epsilon`).
    """
    if not is_dp(config):
        return None
    from tensorfleet.federated.aggregators.dp import epsilon

    noise = float({**_entry(config).defaults, **config.aggregator_options}["noise_multiplier"])
    return epsilon(noise_multiplier=noise,
                   clients_per_round=config.clients_per_round, num_clients=num_clients, rounds=rounds_done,
                   delta=config.dp_delta)


def upload_bytes(config: Any, sizes: Sequence[int]) -> int:
    """Bytes one client uploads per round for tensors of ``sizes`` values (the aggregator's own count,
    such as compression's; else float32 values)."""
    entry = _entry(config)
    if entry is None:
        return 4 * int(sum(sizes))
    return entry.bytes_per_client(list(sizes), config.aggregator_options)


def sent_sizes(config: Any, model: Any) -> list[int]:
    """The sizes of the trainable tensors a client of ``model`` uploads: every one, except under FedBN
    (``non_trainable="per_client"``) its BatchNormalization layers', which stay on the client."""
    import numpy as np

    kept: set[int] = set()
    if str(getattr(config.non_trainable, "value", config.non_trainable)) == "per_client":
        from tensorfleet.federated.backends.compiled.local import batch_norm_variables

        kept = set(batch_norm_variables(model))
    return [int(np.prod(w.shape)) for i, w in enumerate(model.trainable_weights) if i not in kept]


def check_participants(config: Any, who: dict[str, list[str]], round_num: int) -> None:
    """ValueError when dropouts and stragglers leave a round fewer participants than its aggregator needs
    (``config.fewest_clients``: Krum's bound, a secure aggregator's 2, an aggregator's own ``min_clients``)."""
    fewest, rule = config.fewest_clients
    count = len(who["participants"])
    if count == 0 or count >= fewest:
        return
    error = too_few_clients(config.aggregator_name, fewest, rule, "participants", count)
    raise ValueError(f"Round {round_num}: {error} ({len(who['dropped'])} of {len(who['sampled'])} sampled clients "
                     f"dropped out, {len(who['stragglers'])} missed the straggler deadline)")
