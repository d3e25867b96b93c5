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

import os
from pathlib import Path
from typing import Any, Callable

from tensorfleet.models import datasets, zoo  # noqa: F401  (internal modules, kept as attributes for older code)
from tensorfleet.models.datasets import Split, load_digits
from tensorfleet.models.zoo import MODELS

# isort: split
# Imported to register, in the order available() lists: the zoo's models, then the MLPerf Tiny reference models,
# then the small transformer block (the split keeps the import sorter from merging these into the line above).
from tensorfleet.models import tinyml, transformer  # noqa: F401

__all__ = ["MODELS", "MODEL_FILE_SUFFIXES", "Split", "available", "build", "describe", "load_digits", "model_file",
           "register"]

MODEL_FILE_SUFFIXES = (".keras", ".h5")
"""The suffixes of saved Keras model files: a name with one of them is a path, never a zoo name."""


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


def model_file(spec: str | os.PathLike[str]) -> Path | None:
    """Whether a model given by name on a command line or in a config (``spec``) is a saved model or a zoo name.

    A path that exists is a saved model (a ``.keras``/``.h5`` file, or a SavedModel folder): its :class:`Path`.
    Otherwise ``spec`` must be a zoo name (:data:`MODELS`): None. A zoo name never ends in ``.keras``/``.h5``
    and never holds a path separator, so the two cannot be confused; what is neither is one error saying both.

    Raises:
        FileNotFoundError: ``spec`` looks like a path (``.keras``, ``.h5``, a separator) and nothing is there.
        UnknownNameError: ``spec`` is neither a file nor a zoo name (the message lists the zoo's names).

    Example:
        >>> model_file("digits_mlp") is None
        True
        >>> model_file("nofile.keras")
        Traceback (most recent call last):
        FileNotFoundError: No file 'nofile.keras', and no zoo model of that name. Available: ...
    """
    from tensorfleet.registry import UnknownNameError

    path = Path(spec)
    if path.exists():
        return path
    text = str(spec)
    looks_like_path = path.suffix in MODEL_FILE_SUFFIXES or os.sep in text or (os.altsep or os.sep) in text
    if not looks_like_path and text in MODELS:
        return None
    try:
        MODELS.canonical(text)
    except UnknownNameError as error:  # the registry's names and closest match, said as "neither"
        message = str(error).replace(f"Unknown model {text!r}.", f"No file {text!r}, and no zoo model of that name.", 1)
        raise (FileNotFoundError if looks_like_path else UnknownNameError)(message) from None
    return None
