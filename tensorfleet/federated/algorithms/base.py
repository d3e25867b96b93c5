"""Shared pieces of the algorithms: the optimizer registry and the algorithm record.

An algorithm is a function ``build(model_fn, *, client_optimizer, server_optimizer, aggregator,
**hyperparameters) -> tff.learning.templates.LearningProcess`` registered in
:data:`tensorfleet.federated.algorithms.ALGORITHMS` with its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tensorfleet.registry import Registry
from tensorfleet.validation import number

__all__ = ["OPTIMIZERS", "OptimizerSpec", "Algorithm", "make_optimizer", "is_unweighted"]

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


@dataclass(frozen=True)
class Algorithm:
    """A registered federated algorithm: its builder, default optimizers and hyperparameters."""

    build: Callable[..., Any]
    client_optimizer: OptimizerSpec | None
    server_optimizer: OptimizerSpec
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    paper: str = ""


def make_optimizer(spec: OptimizerSpec) -> Any:
    """A ``tff.learning.optimizers.Optimizer`` from a spec; checks the learning rate."""
    return OPTIMIZERS.get(spec.name)(number("learning_rate", spec.learning_rate, above=0), **spec.options)


def is_unweighted(aggregator: Any) -> bool:
    """True for a ``tff.aggregators.UnweightedAggregationFactory`` (DP, robust, ...)."""
    import tensorflow_federated as tff

    return isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory)


def _sgd(learning_rate: float, momentum: float | None = None) -> Any:
    import tensorflow_federated as tff

    return tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum)


def _sgdm(learning_rate: float, momentum: float = 0.9) -> Any:
    return _sgd(learning_rate, momentum)


def _adam(learning_rate: float, **kw: Any) -> Any:
    import tensorflow_federated as tff

    return tff.learning.optimizers.build_adam(learning_rate, **kw)


def _yogi(learning_rate: float, **kw: Any) -> Any:
    import tensorflow_federated as tff

    return tff.learning.optimizers.build_yogi(learning_rate, **kw)


def _adagrad(learning_rate: float, **kw: Any) -> Any:
    import tensorflow_federated as tff

    return tff.learning.optimizers.build_adagrad(learning_rate, **kw)


def _rmsprop(learning_rate: float, **kw: Any) -> Any:
    import tensorflow_federated as tff

    return tff.learning.optimizers.build_rmsprop(learning_rate, **kw)


OPTIMIZERS.register("sgd", _sgd, description="Plain SGD (TFF build_sgdm without momentum).")
OPTIMIZERS.register("sgdm", _sgdm, aliases=("momentum",), description="SGD with momentum (default 0.9).")
OPTIMIZERS.register("adam", _adam, description="Adam (Kingma and Ba 2015).")
OPTIMIZERS.register("yogi", _yogi, description="Yogi (Zaheer et al. 2018).")
OPTIMIZERS.register("adagrad", _adagrad, description="Adagrad (Duchi et al. 2011).")
OPTIMIZERS.register("rmsprop", _rmsprop, description="RMSprop.")
