"""Attributes of a package loaded on first use (PEP 562's module ``__getattr__``).

Every room's ``__init__`` names its public names here instead of importing them, so that
``import tensorfleet`` stays cheap and touches no device until a feature is used, and imports the
same names under ``if TYPE_CHECKING:`` for editors and type checkers (tests/test_public_surface.py
holds the two equal). What a room serves is its public surface; its modules are internal.

Example:
    >>> getattr_, names = attach("email", modules=("charset",), names={"Header": "header"}, internal=("utils",))
    >>> getattr_("Header").__module__, getattr_("charset").__name__, getattr_("utils").__name__, names
    ('email.header', 'email.charset', 'email.utils', ['charset', 'Header'])
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
           names: Mapping[str, str] | None = None,
           internal: Iterable[str] = ()) -> tuple[Callable[[str], Any], list[str]]:
    """A module ``__getattr__`` for ``package`` and the names it serves (for ``__all__``).

    Args:
        package: the package's ``__name__``.
        modules: public submodules served as attributes (the rooms of ``tensorfleet``).
        names: public name -> the submodule (relative to ``package``) that defines it, or
            ``"submodule:attribute"`` where the public name is not the one it is defined under.
        internal: submodules still served as attributes for code written against them
            (``tfl.planner.cost_model``), left out of the names returned: they are not the public surface.
    """
    modules, names = tuple(modules), dict(names or {})
    served = (*modules, *internal)

    def __getattr__(name: str) -> Any:
        if name in served:
            value = importlib.import_module(f"{package}.{name}")
        elif name in names:
            module, _, attribute = names[name].partition(":")
            value = getattr(importlib.import_module(f"{package}.{module}"), attribute or name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # found once, then a plain attribute
        return value

    return __getattr__, [*modules, *names]
