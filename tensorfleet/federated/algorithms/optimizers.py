"""The compiled backend's optimizers: pure ``(initialize, next)`` pairs over nested weights, without TFF.

They follow the update rules ``tff.learning.optimizers`` documents (and the ``tff`` backend runs
with TFF's own), with the same state (a dict of the hyperparameters, a step count and the
accumulators, in the same order), so that both backends step alike, and a compiled run's
checkpoint holds the same tensors on either track:

* ``sgd`` / ``sgdm``: ``v = m * v + g``, ``w = w - lr * v`` (no ``v`` without momentum);
* ``adam`` (Kingma and Ba, ICLR 2015): ``a += (g - a) * (1 - b1)``, ``s += (g^2 - s) * (1 - b2)``,
  ``w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * a / (sqrt(s) + eps)``;
* ``yogi`` (Zaheer et al., NeurIPS 2018): Adam with ``s += (1 - b2) * sign(g^2 - s) * g^2`` from
  ``s = 1e-6``;
* ``adagrad`` (Duchi et al., JMLR 2011): ``s += g^2`` from ``s = 0.1``, ``w -= lr * g / sqrt(s + eps)``;
* ``rmsprop``: ``s += (g^2 - s) * (1 - decay)``, ``w -= lr * g / (sqrt(s) + eps)``.

``initialize(specs)`` takes the weights' ``tf.TensorSpec`` structure; ``next(state, weights,
gradients)`` returns ``(state, weights)``; both run eagerly or traced.

Example (two SGD steps with momentum 0.5 on w = 1, gradient 1: v = 1 then 1.5):
    >>> import tensorflow as tf
    >>> opt = build("sgdm", 0.1, momentum=0.5)
    >>> state = opt.initialize((tf.TensorSpec([], tf.float32),))
    >>> state, w = opt.next(state, (tf.constant(1.0),), (tf.constant(1.0),))
    >>> state, w = opt.next(state, w, (tf.constant(1.0),))
    >>> round(float(w[0]), 6), list(state)
    (0.75, ['learning_rate', 'momentum', 'accumulator'])
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from tensorfleet.validation import number

__all__ = ["Adagrad", "Adam", "FederatedOptimizer", "RmsProp", "Sgd", "Yogi", "build"]

LEARNING_RATE_KEY = "learning_rate"


def _zeros(specs: Any, fill: float = 0.0) -> Any:
    import tensorflow as tf

    return tf.nest.map_structure(lambda s: tf.ones(s.shape, s.dtype) * fill if fill else tf.zeros(s.shape, s.dtype),
                                 specs)


def _beta(name: str, value: float) -> float:
    return float(number(name, value, minimum=0, below=1))


class FederatedOptimizer:
    """The protocol: ``initialize(specs) -> state`` and ``next(state, weights, gradients) -> (state, weights)``;
    ``get_hparams``/``set_hparams`` read and replace the state's hyperparameters."""

    hparam_keys: tuple[str, ...] = (LEARNING_RATE_KEY,)

    def initialize(self, specs: Any) -> Any:  # pragma: no cover - the protocol
        raise NotImplementedError

    def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:  # pragma: no cover
        raise NotImplementedError

    def get_hparams(self, state: Any) -> Any:
        return collections.OrderedDict((k, state[k]) for k in self.hparam_keys)

    def set_hparams(self, state: Any, hparams: Any) -> Any:
        updated = collections.OrderedDict(state)
        for key, value in hparams.items():
            if key not in self.hparam_keys:
                raise KeyError(f"{type(self).__name__} has no hyperparameter {key!r} (its: "
                               f"{', '.join(self.hparam_keys)})")
            updated[key] = value
        return updated


class Sgd(FederatedOptimizer):
    """SGD, with momentum when ``momentum`` is a positive number."""

    def __init__(self, learning_rate: float, momentum: float | None = None) -> None:
        self.learning_rate = float(number("learning_rate", learning_rate, minimum=0))
        self.momentum = None if not momentum else float(number("momentum", momentum, minimum=0, maximum=1))
        self.hparam_keys = (LEARNING_RATE_KEY, "momentum") if self.momentum else (LEARNING_RATE_KEY,)

    def initialize(self, specs: Any) -> Any:
        state = collections.OrderedDict([(LEARNING_RATE_KEY, self.learning_rate)])
        if self.momentum:
            state["momentum"] = self.momentum
            state["accumulator"] = _zeros(specs)
        return state

    def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        lr = state[LEARNING_RATE_KEY]
        if "momentum" not in state:
            weights = tf.nest.map_structure(lambda w, g: w if g is None else w - tf.cast(lr, g.dtype) * g,
                                            weights, gradients)
            return collections.OrderedDict([(LEARNING_RATE_KEY, lr)]), weights
        momentum = state["momentum"]
        accumulator = tf.nest.map_structure(lambda a, g: a if g is None else momentum * a + g,
                                            state["accumulator"], gradients)
        weights = tf.nest.map_structure(lambda w, a, g: w if g is None else w - lr * a, weights, accumulator, gradients)
        return collections.OrderedDict([(LEARNING_RATE_KEY, lr), ("momentum", momentum),
                                        ("accumulator", accumulator)]), weights


class Adam(FederatedOptimizer):
    """Adam, bias-corrected through the learning rate."""

    hparam_keys = (LEARNING_RATE_KEY, "beta_1", "beta_2", "epsilon")
    initial_preconditioner = 0.0

    def __init__(self, learning_rate: float, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7) -> None:
        self.learning_rate = float(number("learning_rate", learning_rate, minimum=0))
        self.beta_1, self.beta_2 = _beta("beta_1", beta_1), _beta("beta_2", beta_2)
        self.epsilon = float(number("epsilon", epsilon, minimum=0))

    def initialize(self, specs: Any) -> Any:
        return collections.OrderedDict([
            (LEARNING_RATE_KEY, self.learning_rate), ("beta_1", self.beta_1), ("beta_2", self.beta_2),
            ("epsilon", self.epsilon), ("step", 0), ("accumulator", _zeros(specs)),
            ("preconditioner", _zeros(specs, self.initial_preconditioner))])

    def second_moment(self, s: Any, g: Any, beta_2: Any) -> Any:
        import tensorflow as tf

        return s + (tf.math.square(g) - s) * (1 - beta_2)

    def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        lr, beta_1, beta_2, epsilon = (state[k] for k in self.hparam_keys)
        step = state["step"] + 1
        accumulator = tf.nest.map_structure(lambda a, g: a + (g - a) * (1 - beta_1), state["accumulator"], gradients)
        preconditioner = tf.nest.map_structure(lambda s, g: self.second_moment(s, g, beta_2), state["preconditioner"],
                                               gradients)
        t = tf.cast(step, tf.float32)
        scaled_lr = lr * tf.math.sqrt(1 - tf.math.pow(beta_2, t)) / (1 - tf.math.pow(beta_1, t))
        weights = tf.nest.map_structure(lambda w, a, s: w - scaled_lr * a / (tf.math.sqrt(s) + epsilon),
                                        weights, accumulator, preconditioner)
        return collections.OrderedDict([
            (LEARNING_RATE_KEY, lr), ("beta_1", beta_1), ("beta_2", beta_2), ("epsilon", epsilon), ("step", step),
            ("accumulator", accumulator), ("preconditioner", preconditioner)]), weights


class Yogi(Adam):
    """Yogi: Adam whose second moment moves additively, by the sign of ``g^2 - s``."""

    def __init__(self, learning_rate: float, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-3,
                 initial_preconditioner_value: float = 1e-6) -> None:
        super().__init__(learning_rate, beta_1, beta_2, epsilon)
        self.initial_preconditioner = float(number("initial_preconditioner_value", initial_preconditioner_value,
                                                   above=0))

    def second_moment(self, s: Any, g: Any, beta_2: Any) -> Any:
        import tensorflow as tf

        g2 = tf.math.square(g)
        return s + (1 - beta_2) * tf.sign(g2 - s) * g2


class Adagrad(FederatedOptimizer):
    """Adagrad: the learning rate over the root of the summed squared gradients."""

    hparam_keys = (LEARNING_RATE_KEY, "epsilon")

    def __init__(self, learning_rate: float, initial_preconditioner_value: float = 0.1, epsilon: float = 1e-7) -> None:
        self.learning_rate = float(number("learning_rate", learning_rate, minimum=0))
        self.initial = float(number("initial_preconditioner_value", initial_preconditioner_value, minimum=0))
        self.epsilon = float(number("epsilon", epsilon, minimum=0))

    def initialize(self, specs: Any) -> Any:
        import tensorflow as tf

        return collections.OrderedDict([
            (LEARNING_RATE_KEY, self.learning_rate), ("epsilon", self.epsilon),
            ("preconditioner", tf.nest.map_structure(lambda s: tf.ones(s.shape, s.dtype) * self.initial, specs))])

    def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        lr, epsilon = state[LEARNING_RATE_KEY], state["epsilon"]
        preconditioner = tf.nest.map_structure(lambda s, g: s + tf.math.square(g), state["preconditioner"], gradients)
        weights = tf.nest.map_structure(lambda w, g, s: w - lr * g / tf.math.sqrt(s + epsilon),
                                        weights, gradients, preconditioner)
        return collections.OrderedDict([(LEARNING_RATE_KEY, lr), ("epsilon", epsilon),
                                        ("preconditioner", preconditioner)]), weights


class RmsProp(FederatedOptimizer):
    """RMSprop (Tieleman and Hinton, 2012)."""

    hparam_keys = (LEARNING_RATE_KEY, "decay", "epsilon")

    def __init__(self, learning_rate: float, decay: float = 0.9, epsilon: float = 1e-7) -> None:
        self.learning_rate = float(number("learning_rate", learning_rate, minimum=0))
        self.decay = _beta("decay", decay)
        self.epsilon = float(number("epsilon", epsilon, minimum=0))

    def initialize(self, specs: Any) -> Any:
        return collections.OrderedDict([(LEARNING_RATE_KEY, self.learning_rate), ("decay", self.decay),
                                        ("epsilon", self.epsilon), ("preconditioner", _zeros(specs))])

    def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        lr, decay, epsilon = (state[k] for k in self.hparam_keys)
        preconditioner = tf.nest.map_structure(lambda s, g: s + (tf.math.square(g) - s) * (1 - decay),
                                               state["preconditioner"], gradients)
        weights = tf.nest.map_structure(lambda w, g, s: w - lr * g / (tf.math.sqrt(s) + epsilon),
                                        weights, gradients, preconditioner)
        return collections.OrderedDict([(LEARNING_RATE_KEY, lr), ("decay", decay), ("epsilon", epsilon),
                                        ("preconditioner", preconditioner)]), weights


_BUILDERS: dict[str, Callable[..., FederatedOptimizer]] = {
    "sgd": lambda lr, momentum=None: Sgd(lr, momentum), "sgdm": lambda lr, momentum=0.9: Sgd(lr, momentum),
    "adam": Adam, "yogi": Yogi, "adagrad": Adagrad, "rmsprop": RmsProp,
}


def build(name: str, learning_rate: float, **options: Any) -> FederatedOptimizer:
    """The optimizer registered as ``name`` (canonical, see
    :data:`~tensorfleet.federated.algorithms.OPTIMIZERS`) with its learning rate and options."""
    try:
        maker = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"Unknown optimizer {name!r}. Available: {', '.join(_BUILDERS)}") from None
    return maker(learning_rate, **options)
