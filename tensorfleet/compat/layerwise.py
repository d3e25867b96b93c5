"""LARS and LAMB as optimizers of each Keras: subclasses of each Keras's own ``Optimizer`` that use its
protected API for custom optimizers (``_get_variable_index``, ``_build_learning_rate``, ``_var_key``, ...), so
they live here, beside the other reaches into Keras. The public names and what the optimizers compute:
:mod:`tensorfleet.strategies.layerwise`.

Example:
    >>> import keras
    >>> opt = lars(learning_rate=0.1, keras="keras3")
    >>> isinstance(opt, keras.optimizers.Optimizer), opt.get_config()["eta"]
    (True, 0.001)
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, TypedDict

from tensorfleet.compat.keras import Keras, as_keras, keras_module
from tensorfleet.validation import number

__all__ = ["NAMES", "lamb", "lamb_update", "lars", "lars_update", "optimizer_class", "register_serializable"]

log = logging.getLogger(__name__)

NAMES = ("LARS", "LAMB")


def _adapted(variable: Any) -> bool:
    """Whether the layer-wise adaptation and the weight decay apply: kernels yes, biases and norms no."""
    return len(variable.shape) > 1


def _trust_ratio(numerator: Any, w_norm: Any, u_norm: Any, denominator: Any) -> Any:
    import tensorflow as tf

    one = tf.ones_like(w_norm)
    ratio = numerator / tf.where(denominator > 0, denominator, one)
    return tf.where(w_norm > 0, tf.where(u_norm > 0, ratio, one), one)


def lars_update(w: Any, g: Any, v: Any, *, lr: Any, momentum: float, eta: float, weight_decay: float,
                adapt: bool) -> tuple[Any, Any]:
    """One LARS step (module docstring) on tensors: the new weight and the new momentum buffer."""
    import tensorflow as tf

    if not adapt:
        v = momentum * v + lr * g
        return w - v, v
    w_norm, g_norm = tf.norm(w), tf.norm(g)
    local_lr = _trust_ratio(eta * w_norm, w_norm, g_norm, g_norm + weight_decay * w_norm)
    v = momentum * v + lr * local_lr * (g + weight_decay * w)
    return w - v, v


def lamb_update(w: Any, g: Any, m: Any, v: Any, *, lr: Any, step: Any, beta_1: float, beta_2: float,
                epsilon: float, weight_decay: float, adapt: bool) -> tuple[Any, Any, Any]:
    """One LAMB step (module docstring) on tensors at ``step`` (from 1): new weight, first and second moments."""
    import tensorflow as tf

    m = beta_1 * m + (1.0 - beta_1) * g
    v = beta_2 * v + (1.0 - beta_2) * tf.square(g)
    r = (m / (1.0 - tf.pow(beta_1, step))) / (tf.sqrt(v / (1.0 - tf.pow(beta_2, step))) + epsilon)
    if not adapt:
        return w - lr * r, m, v
    r = r + weight_decay * w
    w_norm, r_norm = tf.norm(w), tf.norm(r)
    return w - lr * _trust_ratio(w_norm, w_norm, r_norm, r_norm) * r, m, v


class _Bounds(TypedDict, total=False):
    """A hyperparameter's bounds, as :func:`tensorfleet.validation.number` takes them."""

    minimum: float
    maximum: float
    above: float
    below: float


class _Hyper:
    """The hyperparameters both Kerases' classes share, checked once, and their config."""

    _HYPER: dict[str, _Bounds] = {}

    def _set_hyper_values(self, values: dict[str, Any]) -> None:
        for key, bounds in self._HYPER.items():
            setattr(self, f"_{key}", number(key, values[key], **bounds))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()  # type: ignore[misc]
        config.update({key: getattr(self, f"_{key}") for key in self._HYPER})
        return config


class _LARSHyper(_Hyper):
    _HYPER = {"momentum": {"minimum": 0, "maximum": 1}, "eta": {"above": 0}, "weight_decay": {"minimum": 0}}


class _LAMBHyper(_Hyper):
    _HYPER = {"beta_1": {"minimum": 0, "below": 1}, "beta_2": {"minimum": 0, "below": 1},
              "epsilon": {"above": 0}, "weight_decay": {"minimum": 0}}


def _dense(gradient: Any) -> Any:
    import tensorflow as tf

    return tf.convert_to_tensor(gradient)


def _keras3_classes() -> dict[str, type]:
    import tensorflow as tf

    base: Any = keras_module(Keras.KERAS3).optimizers.Optimizer  # a class of a module mypy does not follow

    class LARS(_LARSHyper, base):
        """LARS (You et al. 2017) as a Keras 3 optimizer; see :mod:`tensorfleet.strategies.layerwise`."""

        def __init__(self, learning_rate: Any = 0.1, momentum: float = 0.9, eta: float = 0.001,
                     weight_decay: float = 1e-4, name: str = "lars", **kwargs: Any) -> None:
            # The paper's weight decay lives in the trust ratio: Keras's decoupled one stays off (None).
            super().__init__(learning_rate=learning_rate, name=name, **kwargs)
            self._set_hyper_values({"momentum": momentum, "eta": eta, "weight_decay": weight_decay})

        def build(self, var_list: list[Any]) -> None:
            if self.built:
                return
            super().build(var_list)
            self._velocities = self.add_optimizer_variables(var_list, "velocity")

        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            v = self._velocities[self._get_variable_index(variable)]
            w, v_new = lars_update(tf.convert_to_tensor(variable), tf.cast(_dense(gradient), variable.dtype),
                                   tf.convert_to_tensor(v), lr=tf.cast(learning_rate, variable.dtype),
                                   momentum=self._momentum, eta=self._eta, weight_decay=self._weight_decay,
                                   adapt=_adapted(variable))
            self.assign(v, v_new)
            self.assign(variable, w)

    return {"LARS": LARS, "LAMB": keras_module(Keras.KERAS3).optimizers.Lamb}


def _keras2_base() -> type:
    """What LARS and LAMB share as tf_keras optimizers: the learning rate, slots by name, the config."""
    base: Any = keras_module(Keras.KERAS2).optimizers.Optimizer  # a class of a module mypy does not follow

    class _Keras2(base):
        def __init__(self, learning_rate: Any, name: str, **kwargs: Any) -> None:
            super().__init__(name=name, **kwargs)
            self._learning_rate = self._build_learning_rate(learning_rate)

        def _slots(self, var_list: list[Any], names: tuple[str, ...]) -> list[list[Any]]:
            return [[self.add_variable_from_reference(model_variable=var, variable_name=n) for var in var_list]
                    for n in names]

        def get_config(self) -> dict[str, Any]:
            config = super().get_config()
            config["learning_rate"] = self._serialize_hyperparameter(self._learning_rate)
            return config

    return _Keras2


def _keras2_classes() -> dict[str, type]:
    import tensorflow as tf

    _Keras2: Any = _keras2_base()

    class LARS(_LARSHyper, _Keras2):
        """LARS (You et al. 2017) as a tf_keras optimizer; see :mod:`tensorfleet.strategies.layerwise`."""

        def __init__(self, learning_rate: Any = 0.1, momentum: float = 0.9, eta: float = 0.001,
                     weight_decay: float = 1e-4, name: str = "LARS", **kwargs: Any) -> None:
            super().__init__(learning_rate, name, **kwargs)
            self._set_hyper_values({"momentum": momentum, "eta": eta, "weight_decay": weight_decay})

        def build(self, var_list: list[Any]) -> None:
            super().build(var_list)
            if getattr(self, "_built", False):
                return
            (self._velocities,) = self._slots(var_list, ("v",))
            self._built = True

        def update_step(self, gradient: Any, variable: Any) -> None:
            v = self._velocities[self._index_dict[self._var_key(variable)]]
            w, v_new = lars_update(tf.convert_to_tensor(variable), tf.cast(_dense(gradient), variable.dtype),
                                   tf.convert_to_tensor(v), lr=tf.cast(self.learning_rate, variable.dtype),
                                   momentum=self._momentum, eta=self._eta, weight_decay=self._weight_decay,
                                   adapt=_adapted(variable))
            v.assign(v_new)
            variable.assign(w)

    class LAMB(_LAMBHyper, _Keras2):
        """LAMB (You et al. 2019) as a tf_keras optimizer; see :mod:`tensorfleet.strategies.layerwise`."""

        def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                     epsilon: float = 1e-6, weight_decay: float = 0.0, name: str = "LAMB", **kwargs: Any) -> None:
            super().__init__(learning_rate, name, **kwargs)
            self._set_hyper_values({"beta_1": beta_1, "beta_2": beta_2, "epsilon": epsilon,
                                    "weight_decay": weight_decay})

        def build(self, var_list: list[Any]) -> None:
            super().build(var_list)
            if getattr(self, "_built", False):
                return
            self._m, self._v = self._slots(var_list, ("m", "v"))
            self._built = True

        def update_step(self, gradient: Any, variable: Any) -> None:
            index = self._index_dict[self._var_key(variable)]
            m, v = self._m[index], self._v[index]
            w, m_new, v_new = lamb_update(
                tf.convert_to_tensor(variable), tf.cast(_dense(gradient), variable.dtype), tf.convert_to_tensor(m),
                tf.convert_to_tensor(v), lr=tf.cast(self.learning_rate, variable.dtype),
                step=tf.cast(self.iterations + 1, variable.dtype), beta_1=self._beta_1, beta_2=self._beta_2,
                epsilon=self._epsilon, weight_decay=self._weight_decay, adapt=_adapted(variable))
            m.assign(m_new)
            v.assign(v_new)
            variable.assign(w)

    return {"LARS": LARS, "LAMB": LAMB}


@functools.cache
def _classes(which: Keras) -> dict[str, type]:
    classes = _keras3_classes() if which is Keras.KERAS3 else _keras2_classes()
    register = keras_module(which).saving.register_keras_serializable
    for name, cls in classes.items():
        if cls.__module__ == __name__:
            cls.__module__, cls.__qualname__ = __name__, name
            # Saved as "tensorfleet>LARS": a model compiled with it loads where this module is imported.
            classes[name] = register(package="tensorfleet", name=name)(cls)
    return classes


def register_serializable() -> list[Keras]:
    """Registers the optimizers with each Keras this process uses (the one ``tf.keras`` is, and any other already
    imported), so ``load_model`` reads a model compiled with them without ``custom_objects``. Importing
    :mod:`tensorfleet.strategies.layerwise` calls it; it never imports a Keras the process does not use.

    Returns:
        The Kerases registered with.
    """
    from tensorfleet.compat.keras import user_keras

    wanted = {user_keras()}
    if "tf_keras" in sys.modules:
        wanted.add(Keras.KERAS2)
    if "keras" in sys.modules and getattr(sys.modules["keras"], "__version__", "").startswith("3."):
        wanted.add(Keras.KERAS3)
    for which in sorted(wanted, key=lambda k: k.value):
        _classes(which)
    return sorted(wanted, key=lambda k: k.value)


def optimizer_class(name: str, keras: Keras | str | Any = None) -> type:
    """The optimizer class ``name`` (``"LARS"`` or ``"LAMB"``) for one Keras, made on its first use.

    For Keras 3, ``"LAMB"`` is Keras's own ``keras.optimizers.Lamb``.

    Args:
        name: ``"LARS"`` or ``"LAMB"`` (any case).
        keras: ``"keras3"``, ``"keras2"``, a Keras model (its Keras), or None for the Keras ``tf.keras`` is here.

    Raises:
        ValueError: another name, or an unknown Keras name.
    """
    key = str(name).strip().upper() if isinstance(name, str) else None
    if key not in NAMES:
        raise ValueError(f"name must be one of 'LARS', 'LAMB'. Received: name={name!r}")
    return _classes(as_keras(keras, "layerwise.optimizer_class"))[key]


def lars(learning_rate: Any = 0.1, *, momentum: float = 0.9, eta: float = 0.001, weight_decay: float = 1e-4,
         keras: Keras | str | Any = None, **kwargs: Any) -> Any:
    """A LARS optimizer (You et al. 2017) of the model's Keras; ``kwargs`` go to that Keras's ``Optimizer``.

    Example:
        >>> opt = lars(0.5, momentum=0.8, keras="keras2")
        >>> type(opt).__name__, opt.get_config()["momentum"]
        ('LARS', 0.8)
    """
    return optimizer_class("LARS", keras)(learning_rate=learning_rate, momentum=momentum, eta=eta,
                                          weight_decay=weight_decay, **kwargs)


def lamb(learning_rate: Any = 0.001, *, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
         weight_decay: float | None = None, keras: Keras | str | Any = None, **kwargs: Any) -> Any:
    """A LAMB optimizer (You et al. 2019) of the model's Keras: Keras 3's own ``keras.optimizers.Lamb`` for a
    Keras 3 model (``weight_decay`` then Keras's decoupled decay), the class here for tf_keras."""
    which = as_keras(keras, "layerwise.lamb")
    if which is Keras.KERAS3:
        log.info("LAMB for a Keras 3 model: Keras's own keras.optimizers.Lamb")
    elif weight_decay is None:
        weight_decay = 0.0
    return optimizer_class("LAMB", which)(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                                          epsilon=epsilon, weight_decay=weight_decay, **kwargs)
