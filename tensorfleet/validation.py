"""Checks of option values shared across tensorfleet, with Keras-style messages.

Every public entry point checks its arguments with these, so a bad value gets the same kind of
message everywhere: what is wrong, the value received and what would be right
(``"num_clients must be a positive integer. Received: num_clients=0"``). Sizes, bandwidths,
durations and parameter counts written with units (``"16GB"``, ``"100Gbps"``, ``"5us"``,
``"1.5B"``) are parsed here too.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import re
import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

__all__ = [
    "UnknownOptionError", "boolean", "choice", "optional_boolean", "integer", "number", "parse_bandwidth",
    "parse_bytes", "parse_count", "parse_duration", "port", "positive_int", "renamed", "renamed_fields", "take_renamed",
]

E = TypeVar("E", bound=Enum)
F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


class UnknownOptionError(TypeError, ValueError):
    """An option name that the callee does not take: a TypeError, as Python's own for an unexpected keyword,
    and a ValueError, since the name often comes as text (a YAML key, ``fedprox:nu=1`` on the command line),
    where it is bad input that the command line reports in one line."""


def _is_int(value: Any) -> bool:
    # numpy integers count as ints; bools, though ints to Python, never do.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int > 0 (not a bool); else ``ValueError`` naming it.

    Example:
        >>> positive_int("num_clients", 0)
        Traceback (most recent call last):
        ValueError: num_clients must be a positive integer. Received: num_clients=0
    """
    return integer(name, value, minimum=1)


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
            optional: bool = False) -> Any:
    """``value`` as an int within ``[minimum, maximum]`` (either bound may be open); ``None`` passes
    when ``optional``. Bools are refused, numpy integers accepted. Else ``ValueError`` naming it.

    Example:
        >>> integer("port", 8500, minimum=1, maximum=65535)
        8500
        >>> integer("stages", 1, minimum=2)
        Traceback (most recent call last):
        ValueError: stages must be an integer >= 2. Received: stages=1
        >>> integer("bits", 40, minimum=1, maximum=32)
        Traceback (most recent call last):
        ValueError: bits must be an integer from 1 to 32. Received: bits=40
    """
    if value is None and optional:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {_integer_range(minimum, maximum)}. Received: {name}={value!r}")
    return int(value)


def _integer_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    if minimum == 1:
        return "a positive integer"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def number(name: str, value: Any, *, minimum: float | None = None, above: float | None = None,
           maximum: float | None = None, below: float | None = None, optional: bool = False) -> Any:
    """``value`` as a finite float, with inclusive (``minimum``/``maximum``) or exclusive
    (``above``/``below``) bounds; ``None`` passes when ``optional``. Else ``ValueError`` naming it.

    Example:
        >>> number("learning_rate", 0.1, above=0)
        0.1
        >>> number("dropout", 1.0, minimum=0, below=1)
        Traceback (most recent call last):
        ValueError: dropout must be a finite number >= 0 and < 1. Received: dropout=1.0
    """
    if value is None and optional:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (minimum is None or value >= minimum) and (above is None or value > above)
    ok = ok and (maximum is None or value <= maximum) and (below is None or value < below)
    if not ok:
        bounds = [f"{op} {bound:g}" for op, bound in ((">=", minimum), (">", above), ("<=", maximum), ("<", below))
                  if bound is not None]
        what = "a finite number" + (" " + " and ".join(bounds) if bounds else "")
        raise ValueError(f"{name} must be {what}. Received: {name}={value!r}")
    return float(value)


def boolean(name: str, value: Any) -> bool:
    """``value`` if it is a bool; ``"no"``, ``1`` or ``None`` are not taken for one.

    Example:
        >>> boolean("progress", "no")
        Traceback (most recent call last):
        ValueError: progress must be true or false. Received: progress='no'
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false. Received: {name}={value!r}")
    return value


def optional_boolean(name: str, value: Any) -> bool | None:
    """``value`` if it is None or a bool (``resume``: None continues what there is, docs/glossary.md).

    Example:
        >>> optional_boolean("resume", 0)
        Traceback (most recent call last):
        ValueError: resume must be None, true or false. Received: resume=0
    """
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be None, true or false. Received: {name}={value!r}")
    return value


def port(name: str, value: Any) -> int:
    """A TCP port number, 1 to 65535.

    Example:
        >>> port("port", 0)
        Traceback (most recent call last):
        ValueError: port must be an integer from 1 to 65535. Received: port=0
    """
    return integer(name, value, minimum=1, maximum=65535)


def choice(enum: type[E], name: str, value: Any) -> E:
    """The member of the string enum ``enum`` that ``value`` names (case and surrounding spaces
    ignored), or ``value`` itself when it is a member; else ``ValueError`` listing the choices.

    Example:
        >>> from enum import Enum
        >>> class Mode(str, Enum):
        ...     RING = "ring"
        ...     TREE = "tree"
        >>> choice(Mode, "mode", " Ring ")
        <Mode.RING: 'ring'>
        >>> choice(Mode, "mode", "star")
        Traceback (most recent call last):
        ValueError: mode must be one of 'ring', 'tree'. Received: mode='star'
    """
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        wanted = value.strip().lower()
        for member in enum:
            if str(member.value).lower() == wanted:
                return member
    choices = ", ".join(repr(m.value) for m in enum)
    raise ValueError(f"{name} must be one of {choices}. Received: {name}={value!r}")


# --------------------------------------------------------------------------- quantities with units

_BYTE_UNITS = {
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# Network rates: bits per second (b) or bytes per second (B/s); both spellings common.
_BIT_RATE_UNITS = {"bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12,
                   "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12, "bit/s": 1}
_BYTE_RATE_UNITS = {"b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
                    "kib/s": 2**10, "mib/s": 2**20, "gib/s": 2**30}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")


def _split(text: str | int | float, what: str, example: str, require_unit: bool = False) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise TypeError(f"{what} must be a string such as {example!r} or a number. Received: {text!r}")
    if isinstance(text, (int, float)):
        if not text >= 0:
            raise ValueError(f"{what} must not be negative. Received: {text!r}")
        return float(text), ""
    stripped = text.strip()
    if stripped.startswith("-"):
        raise ValueError(f"{what} must not be negative. Received: {text!r}")
    match = _NUMBER.match(stripped)
    if not match:
        raise ValueError(f"{what} must be a number with a unit such as {example!r}. Received: {text!r}")
    if require_unit and not match.group(2):
        # A bare "100" is as likely meant in the usual unit (Gbps, GB, us) as in the base one.
        raise ValueError(f"{what} needs a unit, such as {example!r}. Received: {text!r}")
    return float(match.group(1)), match.group(2)


def parse_bytes(text: str | int | float, *, require_unit: bool = False) -> float:
    """Bytes from ``"16GB"``, ``"512MiB"``, ``"1.5e9"`` or a number (decimal GB = 1e9).

    With ``require_unit``, a string without a unit (``"16"``) is refused; a number is still bytes.

    Example:
        >>> parse_bytes("16GB"), parse_bytes("1KiB")
        (16000000000.0, 1024.0)
    """
    value, unit = _split(text, "A memory size", "16GB", require_unit)
    if unit == "":
        return value
    # "B" alone is bytes; a lone lowercase "b" (bits) is not a memory unit.
    factor = _BYTE_UNITS.get(unit.lower()) if unit[-1] == "B" or unit.lower().endswith("ib") else None
    if factor is None:
        raise ValueError(
            f"Unknown memory unit {unit!r} in {text!r}; use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB."
        )
    return value * factor


def parse_bandwidth(text: str | int | float, *, require_unit: bool = False) -> float:
    """Bytes per second from ``"100Gbps"``, ``"25Gbit/s"``, ``"10GB/s"`` or a number (bytes/s).

    With ``require_unit``, a string without a unit (``"100"``) is refused; a number is still bytes/s.

    Example:
        >>> parse_bandwidth("100Gbps"), parse_bandwidth("10GB/s")
        (12500000000.0, 10000000000.0)
        >>> parse_bandwidth("100", require_unit=True)
        Traceback (most recent call last):
        ValueError: A bandwidth needs a unit, such as '100Gbps'. Received: '100'
    """
    value, unit = _split(text, "A bandwidth", "100Gbps", require_unit)
    if unit == "":
        rate = value
    elif unit.lower() in _BIT_RATE_UNITS and not unit.endswith("B/s"):
        rate = value * _BIT_RATE_UNITS[unit.lower()] / 8
    elif unit.endswith("B/s") and unit.lower() in _BYTE_RATE_UNITS:
        rate = value * _BYTE_RATE_UNITS[unit.lower()]
    else:
        raise ValueError(
            f"Unknown bandwidth unit {unit!r} in {text!r}; use bits per second (bps, Mbps, Gbps, "
            "Tbps) or bytes per second (B/s, MB/s, GB/s)."
        )
    if rate <= 0:
        raise ValueError(f"A bandwidth must be positive. Received: {text!r}")
    return rate


def parse_duration(text: str | int | float, *, require_unit: bool = False) -> float:
    """Seconds from ``"5us"``, ``"2ms"``, ``"0.1s"`` or a number of seconds.

    With ``require_unit``, a string without a unit (``"5"``) is refused; a number is still seconds.

    Example:
        >>> parse_duration("2ms")
        0.002
    """
    value, unit = _split(text, "A latency", "5us", require_unit)
    if unit == "":
        return value
    if unit not in _TIME_UNITS:
        raise ValueError(f"Unknown time unit {unit!r} in {text!r}; use one of s, ms, us, ns.")
    return value * _TIME_UNITS[unit]


_COUNT_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str | int | float) -> float:
    """A parameter count from ``"1.5B"``, ``"350M"``, ``"175e9"`` or a number.

    Example:
        >>> parse_count("1.5B"), parse_count("350M")
        (1500000000.0, 350000000.0)
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise TypeError(f"A parameter count must be a number or a string such as '1.5B'. Received: {text!r}")
    if isinstance(text, str):
        raw = text.strip()
        suffix = raw[-1:].lower() if raw[-1:].isalpha() else ""
        if suffix and suffix not in _COUNT_SUFFIX or (suffix == "" and not raw):
            raise ValueError(f"Unknown parameter-count suffix in {text!r}; use K, M, B or T (e.g. '1.5B').")
        try:
            value = float(raw[: len(raw) - len(suffix)]) * _COUNT_SUFFIX[suffix]
        except ValueError:
            raise ValueError(f"A parameter count must look like '1.5B', '350M' or '1e9'. Received: {text!r}") from None
    else:
        value = float(text)
    if not value > 0 or math.isinf(value):
        raise ValueError(f"A parameter count must be positive. Received: {text!r}")
    return value


def take_renamed(values: dict[str, Any], old: str, new: str, where: str, *, stacklevel: int = 3,
                 convert: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """``values`` (keyword arguments, YAML keys) with the older name ``old`` read as ``new`` (docs/glossary.md):
    a DeprecationWarning naming both, for one release; ValueError when both are given. ``convert`` turns an
    older value into the new name's (``fresh=True`` is ``resume=False``). The one place that says so, for
    every renamed parameter, key and flag in the package.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     take_renamed({"arena_size": 4096}, "arena_size", "arena_bytes", "validate_micro")
        {'arena_bytes': 4096}
        >>> str(seen[0].message)
        "validate_micro: 'arena_size' is now 'arena_bytes'; the older name will stop working in the next release."
    """
    if old not in values:
        return values
    values = dict(values)
    received = values.pop(old)
    value = convert(received) if convert is not None else received
    warnings.warn(f"{where}: {old!r} is now {new!r}; the older name will stop working in the next release.",
                  DeprecationWarning, stacklevel=stacklevel)
    if values.get(new) is not None and value is not None:
        raise ValueError(f"{where}: {old!r} is the older name of {new!r}; give one of them. "
                         f"Received: {old}={received!r}, {new}={values[new]!r}")
    if value is not None or new not in values:
        values[new] = value
    return values


def renamed(**old_to_new: str | tuple[str, Callable[[Any], Any]]) -> Callable[[F], F]:
    """Decorator: the function's parameters once had other names (``old=new``, docs/glossary.md); the old
    keywords keep working for one release through :func:`take_renamed`. ``old=(new, convert)`` when the older
    parameter also meant its values otherwise.

    Example:
        >>> @renamed(arena_size="arena_bytes")
        ... def probe(model, *, arena_bytes=None):
        ...     return arena_bytes
        >>> probe(b"", arena_bytes=4096)
        4096
    """
    renames = {old: (new, None) if isinstance(new, str) else new for old, new in old_to_new.items()}

    def decorate(function: F) -> F:
        parameters = inspect.signature(function).parameters
        for old, (new, _) in renames.items():
            if new not in parameters or old in parameters:
                raise TypeError(f"renamed({old}={new!r}) does not fit "
                                f"{function.__qualname__}{inspect.signature(function)}")

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, (new, convert) in renames.items():
                if old in kwargs:
                    kwargs = take_renamed(kwargs, old, new, function.__qualname__, convert=convert)
            return function(*args, **kwargs)

        wrapper.__renamed__ = {old: new for old, (new, _) in renames.items()}  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]
    return decorate


def renamed_fields(**old_to_new: str | tuple[str, Callable[[Any], Any]]) -> Callable[[C], C]:
    """Class decorator (over ``@dataclass``): the class's fields once had other names (``old=new``,
    docs/glossary.md). For one release the constructor takes the older keywords (as :func:`renamed`) and the
    older names read the new fields, each with a DeprecationWarning. ``old=(new, convert)`` where the older name
    meant the opposite: ``convert`` maps either meaning to the other (``operator.not_``).

    Example:
        >>> import dataclasses, operator, warnings
        >>> @renamed_fields(quiet=("verbose", operator.not_))
        ... @dataclasses.dataclass
        ... class Output:
        ...     verbose: bool = False
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     Output(quiet=False).quiet
        False
        >>> [str(w.message) for w in seen][1]
        'Output.quiet is now Output.verbose; the older name will stop working in the next release.'
    """
    def decorate(cls: C) -> C:
        cls.__init__ = renamed(**old_to_new)(cls.__init__)  # type: ignore[misc]
        for old, spec in old_to_new.items():
            new, convert = (spec, None) if isinstance(spec, str) else spec
            setattr(cls, old, _older_name(cls.__name__, old, new, convert))
        return cls
    return decorate


def _older_name(owner: str, old: str, new: str, convert: Callable[[Any], Any] | None) -> property:
    """A read-only attribute ``old`` that reads the field ``new`` (converted) and warns as :func:`take_renamed`."""
    def read(self: Any) -> Any:
        warnings.warn(f"{owner}.{old} is now {owner}.{new}; the older name will stop working in the next release.",
                      DeprecationWarning, stacklevel=2)
        value = getattr(self, new)
        return convert(value) if convert is not None else value

    return property(read, doc=f"The older name of :attr:`{new}`, for one release.")
