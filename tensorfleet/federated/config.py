"""A simulation's configuration as one validated object: :class:`SimulationConfig`.

Every option of :class:`~tensorfleet.federated.Simulation` apart from its model and data is a field
here, checked once when the object is made: numbers and their ranges, the algorithm and its
options, the aggregator and its options, and where the rounds run
(:func:`~tensorfleet.federated.backends.choose_backend`). A bad value fails with one error that
names it, before anything is built.

Example:
    >>> config = SimulationConfig(algorithm="FedProx", algorithm_options={"mu": 0.1}, rounds=5)
    >>> config.algorithm, config.hyperparameters, config.rounds
    ('fedprox', {'mu': 0.1}, 5)
    >>> SimulationConfig(rounds=0)
    Traceback (most recent call last):
    ValueError: rounds must be a positive integer. Received: rounds=0
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tensorfleet.federated.backends import Backend, BackendChoice, choose_backend
from tensorfleet.io import UnwritablePathError, check_writable
from tensorfleet.federated.backends.compiled_layout import NonTrainable
from tensorfleet.federated.backends.compiled_local import check_per_client
from tensorfleet.federated.sampling import StragglerPolicy
from tensorfleet.validation import boolean, choice, integer, number, positive_int

__all__ = ["SimulationConfig", "check_out_dir"]


def check_out_dir(name: str, value: Any) -> Path | None:
    """``value`` as a Path when a run can write its files there (None passes); else ValueError naming it.

    Example:
        >>> from pathlib import Path
        >>> _ = Path("notes.txt").write_text("")
        >>> check_out_dir("out_dir", "notes.txt")
        Traceback (most recent call last):
        ValueError: out_dir must be a directory; 'notes.txt' is a file. Received: out_dir='notes.txt'
    """
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{name} must be a directory path. Received: {name}={value!r}")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} must be a directory; {str(path)!r} is a file. Received: {name}={str(value)!r}")
    try:
        check_writable(path / "metrics.json")
    except UnwritablePathError as err:
        raise ValueError(f"{name} cannot hold the run's files: {err} Received: {name}={str(value)!r}") from None
    return path


@dataclass(frozen=True)
class SimulationConfig:
    """How a simulation runs (everything apart from its model and data).

    Args:
        algorithm: a name in :data:`~tensorfleet.federated.algorithms.ALGORITHMS`.
        rounds: rounds to run in total.
        clients_per_round: clients sampled per round (at most the number of training clients).
        seed: seeds client sampling, dropout, latencies and local shuffling.
        batch_size: local batch size.
        local_epochs: local passes over a client's data per round.
        client_optimizer, client_learning_rate, server_optimizer, server_learning_rate: override
            the algorithm's defaults.
        algorithm_options: the algorithm's hyperparameters (``{"mu": 0.1}`` for ``fedprox``).
        aggregator: a name in :data:`~tensorfleet.federated.aggregators.AGGREGATORS`, or a
            ``tff.aggregators`` factory, or None for the algorithm's mean.
        aggregator_options: options of a named aggregator (``{"noise_multiplier": 1.0}``).
        dp_delta: the delta for the epsilon reported with a DP aggregator.
        dropout: probability that a sampled client drops out of a round.
        straggler_deadline: simulated seconds; a client whose latency exceeds it is a straggler.
        straggler_share: the share of each round's clients that are stragglers running a random
            number of local epochs in ``[1, local_epochs]`` (the FedProx paper's systems
            heterogeneity, Li et al., MLSys 2020, section 5.2); 0: none.
        straggler_policy: ``drop`` (a straggler is left out of the round, as FedAvg does) or
            ``partial`` (its partial work counts, weighted by the examples it trained on: up to
            the deadline, or its epochs).
        non_trainable: what the compiled backend's server does with non-trainable weights
            (BatchNormalization's statistics): ``mean`` (weighted by examples), ``initial``
            (kept at their initial values, as the tff backend's FedAvg keeps them) or ``per_client``
            (FedBN, Li et al., ICLR 2021: each client keeps its own BatchNormalization layers,
            statistics and ``gamma``/``beta``, across rounds; compiled backend only).
        client_speed: median simulated client speed in examples per second (latencies are
            log-normal around it, fixed per client by the seed).
        eval_every: evaluation period in rounds.
        out_dir: where metrics, plots, TensorBoard logs and checkpoints go (None: nowhere).
        checkpoint_every: checkpoint period in rounds (0: none; needs ``out_dir``).
        resume: continue from a checkpoint in ``out_dir`` when there is one.
        progress: show a tqdm progress bar.
        tensorboard: also write TensorBoard summaries into ``out_dir/tensorboard``.
        backend: ``auto`` (the default) runs ``compiled`` where it gives TFF's result, else
            ``tff`` (decided for the model when the simulation is built; the progress bar and
            the history's ``config["backend"]`` say which ran). ``tff`` runs every round on TFF's
            runtime; ``compiled`` runs the same arithmetic as one compiled TensorFlow function in
            this process, without building TFF (every algorithm, with the aggregators of
            :data:`~tensorfleet.federated.backends.compiled.COMPILED_AGGREGATORS`, on any
            client data and a model whose rows do not mix at inference; no TFF needed). Both give
            the same model. ``tff`` needs tensorflow-federated (the tff track).
        workers: ``host:port`` of running TFF workers (``tensorfleet federated worker``; tff track); each
            round's clients are split across them (:mod:`~tensorfleet.federated.backends.remote`).
            None: one worker this process owns.

    Besides the fields, a config holds what they resolve to: ``client_opt`` and ``server_opt``
    (optimizer specs after overrides), ``hyperparameters`` (the algorithm's options with its
    defaults), ``aggregator_name``, ``fewest_clients`` (the fewest participants a round of the aggregator
    needs, and why) and ``where`` (the :class:`~tensorfleet.federated.backends.BackendChoice`).
    """

    algorithm: str = "fedavg"
    rounds: int = 10
    clients_per_round: int = 10
    seed: int = 0
    batch_size: int = 20
    local_epochs: int = 1
    client_optimizer: str | None = None
    client_learning_rate: float | None = None
    server_optimizer: str | None = None
    server_learning_rate: float | None = None
    algorithm_options: dict[str, Any] | None = None
    aggregator: Any = None
    aggregator_options: dict[str, Any] | None = None
    dp_delta: float = 1e-5
    dropout: float = 0.0
    straggler_deadline: float | None = None
    straggler_share: float = 0.0
    straggler_policy: str = "drop"
    non_trainable: str = "mean"
    client_speed: float = 100.0
    eval_every: int = 1
    out_dir: str | os.PathLike[str] | None = None
    checkpoint_every: int = 0
    resume: bool = True
    progress: bool = True
    tensorboard: bool = True
    backend: str | Backend = Backend.AUTO
    workers: Sequence[str] | str | None = None
    client_opt: Any = field(init=False, repr=False)
    server_opt: Any = field(init=False, repr=False)
    hyperparameters: dict[str, Any] = field(init=False, repr=False)
    aggregator_name: str | None = field(init=False, repr=False)
    fewest_clients: tuple[int, str] = field(init=False, repr=False)
    where: BackendChoice = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from tensorfleet.federated import algorithms

        checked: dict[str, Any] = {
            "rounds": positive_int("rounds", self.rounds),
            "clients_per_round": positive_int("clients_per_round", self.clients_per_round),
            "seed": integer("seed", self.seed, minimum=0),
            "batch_size": positive_int("batch_size", self.batch_size),
            "local_epochs": positive_int("local_epochs", self.local_epochs),
            "eval_every": positive_int("eval_every", self.eval_every),
            "checkpoint_every": integer("checkpoint_every", self.checkpoint_every, minimum=0),
            "dropout": number("dropout", self.dropout, minimum=0, below=1),
            "straggler_deadline": number("straggler_deadline", self.straggler_deadline, above=0, optional=True),
            "straggler_share": number("straggler_share", self.straggler_share, minimum=0, maximum=1),
            "straggler_policy": choice(StragglerPolicy, "straggler_policy", self.straggler_policy).value,
            "non_trainable": choice(NonTrainable, "non_trainable", self.non_trainable).value,
            "client_speed": number("client_speed", self.client_speed, above=0),
            "dp_delta": number("dp_delta", self.dp_delta, above=0, below=1),
            "out_dir": check_out_dir("out_dir", self.out_dir),
            "resume": boolean("resume", self.resume), "progress": boolean("progress", self.progress),
            "tensorboard": boolean("tensorboard", self.tensorboard),
            "algorithm_options": dict(self.algorithm_options or {}),
        }
        if checked["checkpoint_every"] and checked["out_dir"] is None:
            raise ValueError(f"checkpoint_every needs an out_dir. Received: checkpoint_every={self.checkpoint_every}, "
                             f"out_dir=None")
        checked["algorithm"], checked["client_opt"], checked["server_opt"], checked["hyperparameters"] = \
            algorithms.resolve(self.algorithm, client_optimizer=self.client_optimizer,
                               client_learning_rate=self.client_learning_rate, server_optimizer=self.server_optimizer,
                               server_learning_rate=self.server_learning_rate, **checked["algorithm_options"])
        checked["aggregator_options"], checked["aggregator_name"] = self._check_aggregator(checked["clients_per_round"])
        checked["fewest_clients"] = self._fewest_clients(checked["aggregator_name"], checked["aggregator_options"])
        if checked["non_trainable"] == NonTrainable.PER_CLIENT.value:
            self._check_per_client(checked)
        checked["where"] = choose_backend(self.backend, self.workers, algorithm=checked["algorithm"],
                                          aggregator=checked["aggregator_name"])
        if checked["non_trainable"] == NonTrainable.PER_CLIENT.value and checked["where"].backend is Backend.TFF:
            check_per_client(tff=True, received=f"algorithm={checked['algorithm']!r}, aggregator="
                                                f"{checked['aggregator_name']!r}, which only backend='tff' runs")
        checked["backend"], checked["workers"] = checked["where"].backend, checked["where"].workers
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def _check_per_client(self, checked: dict[str, Any]) -> None:
        """FedBN's refusals that the options alone decide: the tff backend, or FedSGD (no local steps)."""
        backend = choice(Backend, "backend", self.backend)
        if backend is Backend.TFF or self.workers is not None:
            check_per_client(tff=True, received=f"backend={backend.value!r}" +
                             (f", workers={self.workers!r}" if self.workers is not None else ""))
        check_per_client(tff=False, received=f"algorithm={checked['algorithm']!r}",
                         local_steps=checked["client_opt"] is not None)

    @staticmethod
    def _fewest_clients(name: str | None, options: dict[str, Any]) -> tuple[int, str]:
        """``(fewest participants a round needs, why)``: the registered aggregator's (1 for none, or a TFF factory)."""
        from tensorfleet.federated.aggregators import AGGREGATORS

        return AGGREGATORS.get(name).fewest_clients(options) if name in AGGREGATORS else (1, "")

    def _check_aggregator(self, clients_per_round: int) -> tuple[dict[str, Any], str | None]:
        from tensorfleet.federated import aggregators

        options = dict(self.aggregator_options or {})
        if self.aggregator is not None and not isinstance(self.aggregator, str):
            return options, type(self.aggregator).__name__  # a tff.aggregators factory, used as it is
        if self.aggregator is None:
            if options:
                raise ValueError(f"aggregator_options need an aggregator name. Received: aggregator_options={options}")
            return options, None
        name = aggregators.AGGREGATORS.canonical(self.aggregator)
        aggregators.check_aggregator_options(name, options, clients_per_round=clients_per_round)
        return options, name

    @classmethod
    def from_options(cls, algorithm: str = "fedavg", **options: Any) -> "SimulationConfig":
        """The config of ``Simulation(..., algorithm, **options)``; an unknown option raises TypeError."""
        known = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"Simulation takes no option {unknown[0]!r}. Its options: {', '.join(known)}.")
        return cls(algorithm=algorithm, **options)

    @property
    def optimizer_overrides(self) -> dict[str, Any]:
        """The optimizer arguments given, as :func:`~tensorfleet.federated.algorithms.build_process` takes them."""
        return dict(client_optimizer=self.client_optimizer, client_learning_rate=self.client_learning_rate,
                    server_optimizer=self.server_optimizer, server_learning_rate=self.server_learning_rate)

    def trajectory(self) -> dict[str, Any]:
        """The options that decide the model a run ends with, as plain data (plus ``rounds``)."""
        client = self.client_opt
        return {
            "algorithm": self.algorithm, "algorithm_options": self.hyperparameters,
            "client_optimizer": None if client is None else [client.name, client.learning_rate, client.options],
            "server_optimizer": [self.server_opt.name, self.server_opt.learning_rate, self.server_opt.options],
            "aggregator": self.aggregator_name, "aggregator_options": self.aggregator_options,
            "rounds": self.rounds, "clients_per_round": self.clients_per_round, "seed": self.seed,
            "batch_size": self.batch_size, "local_epochs": self.local_epochs, "dropout": self.dropout,
            "straggler_deadline": self.straggler_deadline, "client_speed": self.client_speed,
            "backend": self.backend.value,
            # New options, recorded when not at their defaults (earlier checkpoints keep their fingerprints).
            **{k: getattr(self, k) for k, default in (("straggler_share", 0.0), ("straggler_policy", "drop"),
                                                      ("non_trainable", "mean")) if getattr(self, k) != default},
            # FedProx's sign: the paper's, not TFF 0.87's (a checkpoint of the other is refused).
            **({"proximal_gradient": "mu * (w - w_server)"} if self.algorithm == "fedprox" else {}),
        }
