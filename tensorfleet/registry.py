"""One registry type for everything tensorfleet looks up by name.

Strategies, federated algorithms, aggregators, partitioners, models and quantization modes
each keep one :class:`Registry`. An unknown name raises :class:`UnknownNameError` that lists
what exists and suggests the closest name, after PyTorch Lightning's strategy registry.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, TypeVar

__all__ = ["Entry", "Registry", "UnknownNameError"]

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that is not in a registry. Subclasses KeyError and ValueError."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered item: its canonical name, the object, a description and aliases."""

    name: str
    obj: T
    description: str = ""
    aliases: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


def _normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_")


class Registry(Generic[T]):
    """A name -> object table with aliases and did-you-mean errors.

    Args:
        kind: what the registry holds, used in messages ("strategy", "model", ...).

    Example:
        >>> reg = Registry("colour")
        >>> reg.register("red", 1, description="warm", aliases=("r",))
        1
        >>> reg.get("R"), reg.canonical("r"), reg.names()
        (1, 'red', ['red'])
        >>> reg.get("rad")
        Traceback (most recent call last):
        ...
        tensorfleet.registry.UnknownNameError: Unknown colour 'rad'. Did you mean 'red'? Available: red.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._aliases: dict[str, str] = {}

    def register(
        self,
        name: str,
        obj: T,
        *,
        description: str = "",
        aliases: tuple[str, ...] | list[str] = (),
        override: bool = False,
        **metadata: Any,
    ) -> T:
        """Adds ``obj`` under ``name`` (and its aliases); returns ``obj``."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"A {self.kind} name must be a non-empty string. Received: name={name!r}")
        key = _normalise(name)
        if not override and (key in self._entries or key in self._aliases):
            raise ValueError(
                f"A {self.kind} named {name!r} is already registered; pass override=True to replace it."
            )
        entry = Entry(name=key, obj=obj, description=description,
                      aliases=tuple(_normalise(a) for a in aliases), metadata=dict(metadata))
        self._entries[key] = entry
        for alias in entry.aliases:
            if not override and (alias in self._entries or alias in self._aliases):
                raise ValueError(f"The alias {alias!r} of {self.kind} {name!r} is already taken.")
            self._aliases[alias] = key
        return obj

    def unregister(self, name: str) -> T:
        """Removes ``name`` (or the entry an alias names) with its aliases; returns its object.

        Raises UnknownNameError, with the did-you-mean, for a name that is not registered.
        """
        key = self.canonical(name)
        entry = self._entries.pop(key)
        for alias in entry.aliases:
            if self._aliases.get(alias) == key:
                del self._aliases[alias]
        return entry.obj

    def decorator(self, name: str, **kwargs: Any) -> Callable[[T], T]:
        """``@registry.decorator("name", description=...)`` form of :meth:`register`."""

        def wrap(obj: T) -> T:
            return self.register(name, obj, **kwargs)

        return wrap

    def canonical(self, name: str) -> str:
        """The canonical name for ``name`` or an alias of it; raises UnknownNameError."""
        if not isinstance(name, str):
            raise TypeError(f"A {self.kind} name must be a string. Received: {name!r} ({type(name).__name__})")
        key = _normalise(name)
        if key in self._entries:
            return key
        if key in self._aliases:
            return self._aliases[key]
        choices = sorted([*self._entries, *self._aliases])
        close = difflib.get_close_matches(key, choices, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(
            f"Unknown {self.kind} {name!r}.{hint} Available: {', '.join(self.names())}."
        )

    def entry(self, name: str) -> Entry[T]:
        return self._entries[self.canonical(name)]

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def names(self) -> list[str]:
        """Canonical names, in registration order."""
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        key = _normalise(name)
        return key in self._entries or key in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
