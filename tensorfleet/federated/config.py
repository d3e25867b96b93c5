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
from typing import Any, Optional, Sequence

from tensorfleet.federated.backends import Backend, BackendChoice, choose_backend
from tensorfleet.federated.backends.compiled.layout import NonTrainable
from tensorfleet.federated.backends.compiled.local import check_per_client
from tensorfleet.federated.options import declared, option, optional_text, text
from tensorfleet.federated.sampling import StragglerPolicy
from tensorfleet.io import check_out_dir
from tensorfleet.validation import UnknownOptionError, boolean, choice, integer, number, optional_boolean, positive_int

__all__ = ["SimulationConfig", "check_out_dir"]


def _mapping(name: str, value: Any) -> dict[str, Any]:
    """Options as a mapping (None: none); text ``key=value,...`` as the command line gives it."""
    from tensorfleet.federated.aggregators import parse_options

    if value is None:
        return {}
    if isinstance(value, str):
        return parse_options(value)
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name} must be a mapping of option names to values (or 'key=value,...'). "
                         f"Received: {name}={value!r}")
    return dict(value)


def _name_and_options(spec: str, options: dict[str, Any], what: str) -> tuple[str, dict[str, Any]]:
    """``NAME:key=value,...`` (``fedprox:mu=1.0``) as ``(NAME, options)``, merged with ``options`` given apart."""
    from tensorfleet.federated.aggregators import parse_options

    name, _, text = spec.partition(":")
    inline = parse_options(text)
    both = sorted(set(inline) & set(options))
    if both:
        raise ValueError(f"{what} option {both[0]!r} is given twice: in {what}={spec!r} and in {what}_options. "
                         f"Received: {what}_options={options!r}")
    return name.strip(), {**options, **inline}


def _workers(name: str, value: Any) -> Any:
    return value  # checked with the backend (choose_backend), which knows what workers need


# The options the fingerprint recorded from the start, in the form trajectory() writes them.
_FIRST_TRAJECTORY = frozenset({
    "algorithm", "algorithm_options", "client_optimizer", "client_learning_rate", "server_optimizer",
    "server_learning_rate", "aggregator", "aggregator_options", "rounds", "clients_per_round", "seed", "batch_size",
    "local_epochs", "dropout", "straggler_deadline", "client_speed", "backend"})


@dataclass(frozen=True)
class SimulationConfig:
    """How a simulation runs (everything apart from its model and data).

    Each field is an option declared once (:func:`~tensorfleet.federated.options.option`): its default, the
    check of its values, its help text and whether it changes the model a run ends with. The same declaration
    makes the YAML keys and the flags of ``tensorfleet federated run``, and the reference's table of them
    (docs/ref-federated-yaml.md). ``algorithm`` and ``aggregator`` also take their options inline, as the
    command line writes them: ``algorithm="fedprox:mu=1.0"``.

    Besides the fields, a config holds what they resolve to: ``client_opt`` and ``server_opt``
    (optimizer specs after overrides), ``hyperparameters`` (the algorithm's options with its
    defaults), ``aggregator_name``, ``fewest_clients`` (the fewest participants a round of the aggregator
    needs, and why) and ``where`` (the :class:`~tensorfleet.federated.backends.BackendChoice`).
    """

    algorithm: str = option(
        "fedavg", None, "A name of `tensorfleet federated algorithms`, with its options after a colon: "
        "fedprox:mu=1.0.", trajectory=True, example="fedprox:mu=1.0")
    rounds: int = option(10, positive_int, "Federated rounds to run (a resumed run continues up to this round).",
                         trajectory=False, example=3)
    clients_per_round: int = option(10, positive_int, "Clients sampled per round (at most the training clients).",
                                    trajectory=True, example=3)
    seed: int = option(0, lambda k, v: integer(k, v, minimum=0),
                       "Seeds the whole run: sampling, shuffling, noise, the model's initial weights and Dropout.",
                       trajectory=True, example=5)
    batch_size: int = option(20, positive_int, "Each client's local batch size.", trajectory=True, example=7)
    local_epochs: int = option(1, positive_int, "Passes over its data each sampled client makes per round.",
                               trajectory=True, example=2)
    client_optimizer: Optional[str] = option(
        None, optional_text,
        "The clients' optimizer (default: the algorithm's): sgd, sgdm, adam, adagrad, yogi, rmsprop.",
        trajectory=True, example="adam")
    client_learning_rate: Optional[float] = option(
        None, lambda k, v: number(k, v, above=0, optional=True),
        "The client optimizer's learning rate (default: the algorithm's).", trajectory=True, example=0.05,
        aliases=("client_lr",))
    server_optimizer: Optional[str] = option(
        None, optional_text,
        "The server's optimizer (default: the algorithm's): sgd, sgdm, adam, adagrad, yogi, rmsprop.",
        trajectory=True, example="sgdm")
    server_learning_rate: Optional[float] = option(
        None, lambda k, v: number(k, v, above=0, optional=True),
        "The server optimizer's learning rate (default: the algorithm's).", trajectory=True, example=0.5,
        aliases=("server_lr",))
    algorithm_options: Optional[dict] = option(
        None, _mapping, "The algorithm's options ({mu: 1.0} for fedprox; also inline: --algorithm fedprox:mu=1.0).",
        trajectory=True, example={"mu": 0.5}, cli_type=str)
    aggregator: Any = option(
        None, None, "A name of `tensorfleet federated aggregators` with its options after a colon "
        "(trimmed_mean:beta=0.2); default: the algorithm's weighted mean. From Python also a tff.aggregators "
        "factory.", trajectory=True, example="median", cli_type=str)
    aggregator_options: Optional[dict] = option(
        None, _mapping, "The aggregator's options ({noise_multiplier: 1.0}; also inline after its name).",
        trajectory=True, example={"beta": 0.2}, cli_type=str)
    dp_delta: float = option(1e-5, lambda k, v: number(k, v, above=0, below=1),
                             "The delta of the epsilon reported with a DP aggregator.", trajectory=True,
                             example=1e-6)
    dropout: float = option(0.0, lambda k, v: number(k, v, minimum=0, below=1),
                            "Probability that a sampled client drops out of a round.", trajectory=True, example=0.2)
    straggler_deadline: Optional[float] = option(
        None, lambda k, v: number(k, v, above=0, optional=True),
        "Simulated seconds; a client whose latency exceeds it is a straggler.", trajectory=True, example=2.0)
    straggler_share: float = option(
        0.0, lambda k, v: number(k, v, minimum=0, maximum=1),
        "Share of each round's clients that run a random number of local epochs in [1, local_epochs] (the FedProx "
        "paper's systems heterogeneity).", trajectory=True, example=0.5)
    straggler_policy: str = option(
        "drop", lambda k, v: choice(StragglerPolicy, k, v).value,
        "drop (stragglers are left out) | partial (their partial work counts, weighted by examples).",
        trajectory=True, example="partial", cli_type=StragglerPolicy)
    non_trainable: str = option(
        "mean", lambda k, v: choice(NonTrainable, k, v).value,
        "mean (BatchNormalization statistics averaged by examples) | initial (kept, as TFF does) | per_client "
        "(FedBN: each client keeps its own BatchNormalization layers).", trajectory=True, example="initial",
        cli_type=NonTrainable)
    client_speed: float = option(100.0, lambda k, v: number(k, v, above=0),
                                 "Median simulated client speed in examples per second (latencies are log-normal "
                                 "around it, fixed per client by the seed).", trajectory=True, example=50.0)
    eval_every: int = option(1, positive_int, "Central (and federated) evaluation every N rounds.",
                             trajectory=False, example=2)
    out_dir: str | os.PathLike[str] | None = option(None, check_out_dir,
                                                    "Directory for metrics, plots, TensorBoard logs and "
                                    "checkpoints (none: nothing is written).", trajectory=False, example="runs/x",
                                    aliases=("out",), flag="--out")
    checkpoint_every: int = option(0, lambda k, v: integer(k, v, minimum=0),
                                   "A checkpoint every N rounds (0: none; needs out_dir); a run started again "
                                   "resumes from it.", trajectory=False, example=1)
    resume: bool | None = option(None, optional_boolean, "Continue from the checkpoint in out_dir: unset, if "
                                 "there is one (else begin); --resume: it must be there; --fresh: start over and "
                                 "overwrite it.", trajectory=False, example=False, flag="--resume/--fresh")
    progress: bool = option(True, boolean, "Show a progress bar with the current metrics.", trajectory=False,
                            example=False, flag="--progress/--no-progress")
    tensorboard: bool = option(True, boolean, "Also write TensorBoard summaries into out_dir/tensorboard.",
                               trajectory=False, example=False, flag="--tensorboard/--no-tensorboard")
    backend: str = option(
        Backend.AUTO.value, None, "auto (compiled where it equals tff, else tff) | compiled (one TensorFlow "
        "function per round; no TFF needed) | tff (tensorflow-federated: the tff track).", trajectory=True,
        example="compiled", cli_type=Backend)
    workers: Sequence[str] | str | None = option(
        None, _workers, "HOST:PORT,HOST:PORT of workers to split each round's clients across: TensorFlow servers "
        "for the compiled backend, TFF workers for tff (`tensorfleet federated worker`); none: this process.",
        trajectory=False, example="127.0.0.1:8000", cli_type=str)
    round_timeout: Optional[float] = option(
        None, lambda k, v: number(k, v, above=0, optional=True),
        "Seconds a round may run on the compiled backend's workers before each is asked whether it still "
        "answers; a silent (frozen) one is dropped and the round runs again on the workers left (default with "
        "workers: 120).", trajectory=False, example=30.0)
    client_opt: Any = field(init=False, repr=False)
    server_opt: Any = field(init=False, repr=False)
    hyperparameters: dict[str, Any] = field(init=False, repr=False)
    aggregator_name: str | None = field(init=False, repr=False)
    fewest_clients: tuple[int, str] = field(init=False, repr=False)
    where: BackendChoice = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from tensorfleet.federated import algorithms

        checked: dict[str, Any] = {name: info.check(name, getattr(self, name))
                                   for name, info in declared(type(self)).items() if info.check is not None}
        checked["algorithm"], checked["algorithm_options"] = _name_and_options(
            text("algorithm", self.algorithm), checked["algorithm_options"], "algorithm")
        if isinstance(self.aggregator, str):
            aggregator, checked["aggregator_options"] = _name_and_options(
                text("aggregator", self.aggregator), checked["aggregator_options"], "aggregator")
        else:
            aggregator = self.aggregator
        checked["aggregator"] = aggregator
        if checked["checkpoint_every"] and checked["out_dir"] is None:
            raise ValueError(f"checkpoint_every needs an out_dir. Received: checkpoint_every={self.checkpoint_every}, "
                             f"out_dir=None")
        checked["algorithm"], checked["client_opt"], checked["server_opt"], checked["hyperparameters"] = \
            algorithms.resolve(checked["algorithm"], client_optimizer=checked["client_optimizer"],
                               client_learning_rate=checked["client_learning_rate"],
                               server_optimizer=checked["server_optimizer"],
                               server_learning_rate=checked["server_learning_rate"], **checked["algorithm_options"])
        checked["aggregator_options"], checked["aggregator_name"] = self._check_aggregator(
            aggregator, checked["aggregator_options"], checked["clients_per_round"])
        checked["fewest_clients"] = self._fewest_clients(checked["aggregator_name"], checked["aggregator_options"])
        if checked["non_trainable"] == NonTrainable.PER_CLIENT.value:
            self._check_per_client(checked)
        checked["where"] = choose_backend(self.backend, self.workers, algorithm=checked["algorithm"],
                                          aggregator=checked["aggregator_name"])
        if checked["non_trainable"] == NonTrainable.PER_CLIENT.value and checked["where"].backend is Backend.TFF:
            check_per_client(tff=True, received=f"algorithm={checked['algorithm']!r}, aggregator="
                                                f"{checked['aggregator_name']!r}, which only backend='tff' runs")
        checked["backend"], checked["workers"] = checked["where"].backend, checked["where"].workers
        if checked["round_timeout"] is not None and (checked["workers"] is None or checked["backend"] is Backend.TFF):
            raise ValueError(f"round_timeout applies to the compiled backend's workers (workers=[...] with backend="
                             f"'compiled'). Received: round_timeout={self.round_timeout!r} with backend="
                             f"{checked['backend'].value!r}, workers={checked['workers']!r}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def _check_per_client(self, checked: dict[str, Any]) -> None:
        """FedBN's refusals that the options alone decide: the tff backend, or FedSGD (no local steps)."""
        backend = choice(Backend, "backend", self.backend)
        if backend is Backend.TFF:
            check_per_client(tff=True, received=f"backend={backend.value!r}")
        check_per_client(tff=False, received=f"algorithm={checked['algorithm']!r}",
                         local_steps=checked["client_opt"] is not None)

    @staticmethod
    def _fewest_clients(name: str | None, options: dict[str, Any]) -> tuple[int, str]:
        """``(fewest participants a round needs, why)``: the registered aggregator's (1 for none, or a TFF factory)."""
        from tensorfleet.federated.aggregators import AGGREGATORS

        return AGGREGATORS.get(name).fewest_clients(options) if name is not None and name in AGGREGATORS else (1, "")

    @staticmethod
    def _check_aggregator(aggregator: Any, options: dict[str, Any],
                          clients_per_round: int) -> tuple[dict[str, Any], str | None]:
        from tensorfleet.federated import aggregators

        if aggregator is not None and not isinstance(aggregator, str):
            return options, type(aggregator).__name__  # a tff.aggregators factory, used as it is
        if aggregator is None:
            if options:
                raise ValueError(f"aggregator_options need an aggregator name. Received: aggregator_options={options}")
            return options, None
        name = aggregators.AGGREGATORS.canonical(aggregator)
        aggregators.check_aggregator_options(name, options, clients_per_round=clients_per_round)
        return options, name

    @classmethod
    def from_options(cls, algorithm: str = "fedavg", **options: Any) -> "SimulationConfig":
        """The config of ``Simulation(..., algorithm, **options)``; an unknown option raises TypeError."""
        known = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise UnknownOptionError(f"Simulation takes no option {unknown[0]!r}. Its options: {', '.join(known)}.")
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
            "backend": Backend(self.backend).value,  # a Backend after __post_init__
            # Options declared since, recorded when not at their defaults (earlier checkpoints keep their
            # fingerprints): every option the declaration marks as changing the trajectory is recorded.
            **{name: getattr(self, name) for name, info in declared(type(self)).items()
               if info.trajectory and name not in _FIRST_TRAJECTORY and getattr(self, name) != info.default},
            # FedProx's sign: the paper's, not TFF 0.87's (a checkpoint of the other is refused).
            **({"proximal_gradient": "mu * (w - w_server)"} if self.algorithm == "fedprox" else {}),
        }
