"""Shared pieces of the algorithms: the optimizer registry and the algorithm record.

An algorithm is registered in :data:`tensorfleet.federated.algorithms.ALGORITHMS` as an
:class:`Algorithm`: its client part for the compiled backend (``client_work``), its finalizer (the
server optimizer) and defaults, and a function ``build(model_fn, *, client_optimizer,
server_optimizer, aggregator, **hyperparameters) -> tff.learning.templates.LearningProcess`` (the
``tff`` backend's, where TFF has the algorithm). An optimizer name gives the compiled backend's optimizer
(:func:`make_optimizer`) and TFF's (:func:`make_tff_optimizer`), which follow the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tensorfleet.registry import Registry
from tensorfleet.validation import number

__all__ = ["OPTIMIZERS", "OptimizerSpec", "Algorithm", "make_optimizer", "make_tff_optimizer", "is_unweighted"]

OPTIMIZERS: Registry[Callable[..., Any]] = Registry("optimizer")


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer by name, with its learning rate and extra options (``momentum``, ``beta_1``...)."""

    name: str
    learning_rate: float
    options: dict[str, Any] = field(default_factory=dict)

    def with_overrides(self, name: str | None = None, learning_rate: float | None = None,
                       **options: Any) -> "OptimizerSpec":
        if name is not None and OPTIMIZERS.canonical(name) != OPTIMIZERS.canonical(self.name):
            return OptimizerSpec(name, self.learning_rate if learning_rate is None else learning_rate, dict(options))
        return OptimizerSpec(self.name, self.learning_rate if learning_rate is None else learning_rate,
                             {**self.options, **options})


def _local_steps(optimizer: Any, hyperparameters: dict[str, Any]) -> Any:
    from tensorfleet.federated.algorithms.client_work import LocalSteps

    return LocalSteps(optimizer, mu=hyperparameters.get("mu", 0.0))


@dataclass(frozen=True)
class Algorithm:
    """A registered federated algorithm: its parts and defaults.

    Attributes:
        build: the ``tff`` backend's builder of its learning process (None: compiled backend only).
        client_optimizer, server_optimizer: the default optimizers (the server's is the finalizer).
        hyperparameters: its options and their defaults.
        paper: where it comes from.
        client_work: ``(client optimizer, hyperparameters) -> ClientWork``, the compiled backend's
            client part (:mod:`~tensorfleet.federated.algorithms.client_work`).
    """

    build: Callable[..., Any] | None
    client_optimizer: OptimizerSpec | None
    server_optimizer: OptimizerSpec
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    paper: str = ""
    client_work: Callable[[Any, dict[str, Any]], Any] = _local_steps


def make_optimizer(spec: OptimizerSpec) -> Any:
    """The compiled backend's optimizer of a spec (:mod:`~tensorfleet.federated.algorithms.optimizers`, no
    TFF); checks the learning rate."""
    return OPTIMIZERS.get(spec.name)(number("learning_rate", spec.learning_rate, above=0), **spec.options)


# TFF's builder of each registered optimizer, for the tff backend (same rules, same state).
_TFF_BUILDERS = {"sgd": "build_sgdm", "sgdm": "build_sgdm", "adam": "build_adam", "yogi": "build_yogi",
                 "adagrad": "build_adagrad", "rmsprop": "build_rmsprop"}


def make_tff_optimizer(spec: OptimizerSpec) -> Any:
    """A ``tff.learning.optimizers.Optimizer`` of a spec, for the ``tff`` backend (needs tensorflow-federated)."""
    from tensorfleet.compat.tff import import_tff

    name = OPTIMIZERS.canonical(spec.name)
    learning_rate = number("learning_rate", spec.learning_rate, above=0)
    tff = import_tff("the tff backend's optimizers")
    options = dict(spec.options)
    if name == "sgdm":
        options.setdefault("momentum", 0.9)
    return getattr(tff.learning.optimizers, _TFF_BUILDERS[name])(learning_rate, **options)


def is_unweighted(aggregator: Any) -> bool:
    """True for a ``tff.aggregators.UnweightedAggregationFactory`` (DP, robust, ...)."""
    from tensorfleet.compat.tff import import_tff

    return isinstance(aggregator, import_tff("TFF's aggregators").aggregators.UnweightedAggregationFactory)


def _builder(name: str) -> Callable[..., Any]:
    def build(learning_rate: float, **options: Any) -> Any:
        from tensorfleet.federated.algorithms import optimizers

        return optimizers.build(name, learning_rate, **options)

    build.__name__ = f"_{name}"
    return build


OPTIMIZERS.register("sgd", _builder("sgd"), description="Plain SGD (as TFF's build_sgdm without momentum).")
OPTIMIZERS.register("sgdm", _builder("sgdm"), aliases=("momentum",), description="SGD with momentum (default 0.9).")
OPTIMIZERS.register("adam", _builder("adam"), description="Adam (Kingma and Ba 2015).")
OPTIMIZERS.register("yogi", _builder("yogi"), description="Yogi (Zaheer et al. 2018).")
OPTIMIZERS.register("adagrad", _builder("adagrad"), description="Adagrad (Duchi et al. 2011).")
OPTIMIZERS.register("rmsprop", _builder("rmsprop"), description="RMSprop.")
