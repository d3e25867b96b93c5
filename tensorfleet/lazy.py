"""Attributes of a package loaded on first use (PEP 562's module ``__getattr__``).

Every room's ``__init__`` names its submodules and public names here instead of importing them,
so that ``import tensorfleet`` stays cheap and touches no device until a feature is used.

Example:
    >>> getattr_, names = attach("email", modules=("charset",), names={"Header": "header"})
    >>> getattr_("Header").__module__, getattr_("charset").__name__, names
    ('email.header', 'email.charset', ['charset', 'Header'])
    >>> getattr_("nope")
    Traceback (most recent call last):
    AttributeError: module 'email' has no attribute 'nope'
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Iterable, Mapping

__all__ = ["attach"]


def attach(package: str, *, modules: Iterable[str] = (),
           names: Mapping[str, str] | None = None) -> tuple[Callable[[str], Any], list[str]]:
    """A module ``__getattr__`` for ``package`` and the names it serves (for ``__all__``).

    Args:
        package: the package's ``__name__``.
        modules: submodules served as attributes (``tfl.planner.cost_model``).
        names: public name -> the submodule (relative to ``package``) that defines it.
    """
    modules, names = tuple(modules), dict(names or {})

    def __getattr__(name: str) -> Any:
        if name in modules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in names:
            value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # found once, then a plain attribute
        return value

    return __getattr__, [*modules, *names]
