"""Which clients take part in a round, and the data each trains on: :class:`ClientSampler`.

Everything is seeded by the configuration's ``seed`` and the round, so that a resumed run samples
and shuffles as an uninterrupted one: round ``r`` draws its clients from ``default_rng([seed, r])``,
a client's examples are visited in an order drawn from ``default_rng([seed, r, stable_hash(id)])``.
Dropped-out clients are drawn with the per-round ``dropout`` rate; stragglers are the clients whose
simulated latency (their examples over a log-normal speed fixed per client) passes the
``straggler_deadline``, and a ``straggler_share`` of the clients drawn to run a random number of
local epochs in ``[1, local_epochs]`` (the FedProx paper's systems heterogeneity). Under
``straggler_policy="drop"`` stragglers are left out; under ``"partial"`` they train on the examples
they got through (in their training order: up to the deadline, or their epochs), which
:meth:`ClientSampler.sample` gives as ``work``.

Example:
    >>> import numpy as np
    >>> from tensorfleet.federated.clients.partition import partition
    >>> from tensorfleet.federated.config import SimulationConfig
    >>> clients = partition(np.zeros((40, 2)), np.arange(40) % 4, num_clients=8, scheme="iid", seed=0)
    >>> sampler = ClientSampler(clients, clients.client_ids, SimulationConfig(clients_per_round=3, seed=1))
    >>> who = sampler.sample(1)
    >>> len(who["sampled"]), who["participants"] == who["sampled"], who == sampler.sample(1)
    (3, True, True)
"""

from __future__ import annotations

import collections
import hashlib
from enum import Enum
from typing import Any, Sequence

import numpy as np

from tensorfleet.validation import positive_int

__all__ = ["ClientSampler", "StragglerPolicy", "default_latency", "split_clients", "stable_hash"]


class StragglerPolicy(str, Enum):
    """What a round does with a straggler: leave it out, or take its partial work."""

    DROP = "drop"
    PARTIAL = "partial"


def default_latency(num_examples: int, speed: float) -> float:
    """Simulated seconds a client needs: its examples over its speed (examples per second)."""
    return num_examples / speed


def stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process (Python's ``hash`` of a str is not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")


class ClientSampler:
    """The clients of each round and their training data, seeded by ``config``.

    Args:
        clients: the ``ClientData`` sampled from.
        train_ids: the ids of the clients that train (not held out for evaluation).
        config: the :class:`~tensorfleet.federated.config.SimulationConfig` whose ``seed``,
            ``clients_per_round``, ``dropout``, ``straggler_deadline``, ``client_speed``,
            ``local_epochs`` and ``batch_size`` apply.
    """

    def __init__(self, clients: Any, train_ids: Sequence[str], config: Any) -> None:
        self.clients = clients
        self.train_ids = list(train_ids)
        self.config = config
        rng = np.random.default_rng([config.seed, 2**31 - 1])
        self.speeds = {cid: config.client_speed * float(np.exp(rng.normal(0.0, 0.5))) for cid in self.train_ids}

    def client_order(self, cid: str, round_num: int, num_examples: int) -> np.ndarray:
        """The order a client visits its examples in a round: one seeded permutation per local epoch."""
        rng = np.random.default_rng([self.config.seed, round_num, stable_hash(cid)])
        return np.concatenate([rng.permutation(num_examples) for _ in range(self.config.local_epochs)])

    def client_arrays(self, cid: str, round_num: int, work: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of a client in training order for round ``round_num`` (local epochs included;
        the first ``work`` examples of them for a straggler's partial work)."""
        x, y = self.clients.arrays(cid)
        order = self.client_order(cid, round_num, len(y))[:work]
        return x[order], y[order]

    def client_dataset(self, data: Any, cid: str, round_num: int, shuffle: bool = True, work: int | None = None) -> Any:
        """The ``tf.data`` dataset of client ``cid`` of ``data`` in round ``round_num`` (batched; shuffled
        and repeated for the local epochs when ``shuffle``; its first ``work`` examples when given)."""
        import tensorflow as tf

        if hasattr(data, "arrays"):
            x, y = self.client_arrays(cid, round_num, work) if shuffle else data.arrays(cid)
            return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(self.config.batch_size)
        ds = data.create_tf_dataset_for_client(cid)
        if shuffle:
            seed = int(np.random.default_rng([self.config.seed, round_num, stable_hash(cid)]).integers(2**31 - 1))
            ds = ds.shuffle(10_000, seed=seed, reshuffle_each_iteration=True).repeat(self.config.local_epochs)
        if work is not None:
            ds = ds.take(work)
        return ds.batch(self.config.batch_size)

    def num_examples(self, cid: str) -> int:
        """How many examples client ``cid`` has."""
        if hasattr(self.clients, "indices"):
            return len(self.clients.indices(cid))
        return int(self.clients.create_tf_dataset_for_client(cid).reduce(0, lambda c, _: c + 1))

    def sample(self, round_num: int) -> dict[str, Any]:
        """The clients of round ``round_num``: sampled, dropped out, stragglers, participants (lists of ids),
        and ``work``: the examples each partial straggler gets through."""
        rng = np.random.default_rng([self.config.seed, round_num])
        picked = rng.choice(len(self.train_ids), size=self.config.clients_per_round, replace=False)
        sampled = [self.train_ids[i] for i in sorted(picked)]
        drop = rng.random(len(sampled)) < self.config.dropout
        dropped = [c for c, d in zip(sampled, drop) if d]
        alive = [c for c, d in zip(sampled, drop) if not d]
        work = self._straggler_work(rng, alive, round_num)
        stragglers = [c for c in alive if c in work]
        partial = self.config.straggler_policy == StragglerPolicy.PARTIAL.value
        kept = {c: n for c, n in work.items() if partial and n > 0}
        participants = [c for c in alive if c not in work or c in kept]
        return {"sampled": sampled, "dropped": dropped, "stragglers": stragglers, "participants": participants,
                "work": kept}

    def _straggler_work(self, rng: np.random.Generator, alive: list[str], round_num: int) -> dict[str, int]:
        """The stragglers among ``alive`` and the examples (in training order) each gets through: up
        to the deadline, or its random local epochs in ``[1, local_epochs]``."""
        epochs = self.config.local_epochs
        work: dict[str, int] = {}
        if self.config.straggler_deadline is not None:
            jitter = np.exp(rng.normal(0.0, 0.1, size=len(alive)))
            for c, j in zip(alive, jitter):
                total = self.num_examples(c) * epochs
                latency = default_latency(total, self.speeds[c]) * j
                if latency > self.config.straggler_deadline:
                    work[c] = int(total * self.config.straggler_deadline / latency)
        if self.config.straggler_share > 0:  # drawn apart, so the other draws stay those of runs without
            slow = np.random.default_rng([self.config.seed, round_num, 0x51_0E])
            chosen = slow.random(len(alive)) < self.config.straggler_share
            ran = slow.integers(1, epochs + 1, size=len(alive))
            for c, pick, e in zip(alive, chosen, ran):
                if pick:
                    work[c] = min(work.get(c, self.num_examples(c) * epochs), self.num_examples(c) * int(e))
        return work


def split_clients(clients: Any, eval_clients: Any) -> tuple[list[str], list[str], Any]:
    """``(training ids, evaluation ids, the ClientData evaluated)`` for ``eval_clients``."""
    all_ids = list(clients.client_ids)
    if eval_clients is None:
        return all_ids, [], None
    if hasattr(eval_clients, "client_ids"):
        return all_ids, list(eval_clients.client_ids), eval_clients
    if isinstance(eval_clients, str) or not isinstance(eval_clients, (int, np.integer)):
        raise TypeError(f"eval_clients must be a ClientData or an int. Received: {type(eval_clients).__name__}")
    held = positive_int("eval_clients", eval_clients)
    if held >= len(all_ids):
        raise ValueError(f"eval_clients must leave at least one training client ({len(all_ids)} clients). "
                         f"Received: eval_clients={held}")
    return all_ids[:-held], all_ids[-held:], clients
