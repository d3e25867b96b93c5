"""Reference Keras models and the offline datasets they train on.

Every model is registered by name in :data:`MODELS`; :func:`build` makes a fresh,
uncompiled ``tf.keras.Model``. Build inside ``strategy.scope()`` to place its variables
under a distribution strategy.

Example:
    >>> import tensorfleet as tfl
    >>> model = tfl.models.build("digits_cnn")
    >>> model.count_params() > 0
    True
"""

from __future__ import annotations

from typing import Any, Callable

from tensorfleet.models import datasets, zoo
from tensorfleet.models.zoo import MODELS
from tensorfleet.models import tinyml  # noqa: F401  (registers the MLPerf Tiny reference models)
from tensorfleet.models import transformer  # noqa: F401  (registers the small transformer block)

__all__ = ["MODELS", "available", "build", "describe", "register", "datasets", "zoo"]


def build(name: str, **options: Any) -> Any:
    """Builds the registered model ``name`` with ``options`` passed to its factory."""
    return MODELS.get(name)(**options)


def available() -> list[str]:
    """Canonical names of the registered models."""
    return MODELS.names()


def describe(name: str) -> str:
    """One-line description of model ``name``."""
    return MODELS.entry(name).description


def register(name: str, factory: Callable[..., Any], *, description: str = "", aliases: tuple[str, ...] = ()) -> None:
    """Registers a model factory under ``name``."""
    MODELS.register(name, factory, description=description, aliases=aliases)
