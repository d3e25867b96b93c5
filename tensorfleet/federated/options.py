"""How an option of a federated simulation is declared, once: :func:`option`.

A simulation's options are the fields of :class:`~tensorfleet.federated.config.SimulationConfig` (and the
experiment's own keys, :class:`~tensorfleet.federated.experiment.ExperimentKeys`), each made with
:func:`option`: its default and type (the field's), the function that checks a value, its help text, whether it
changes the model a run ends with (the checkpoint's fingerprint records it), and how the YAML file and the
command line spell it. Everything else reads the declaration: the Python API (the dataclass), the YAML keys and
their checks (:func:`~tensorfleet.federated.experiment.resolve_config`), the flags of ``tensorfleet federated
run``, the reference's table of keys, and the fingerprint; ``tests/federated/test_options.py`` holds every
option reachable from each.

Example:
    >>> from tensorfleet.federated.config import SimulationConfig
    >>> info = declared(SimulationConfig)["local_epochs"]
    >>> info.flag, info.trajectory, info.help
    ('--local-epochs', True, 'Passes over its data each sampled client makes per round.')
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, Callable

from tensorfleet.validation import take_renamed

__all__ = ["OptionInfo", "declared", "optional_text", "option", "rename_deprecated", "text"]


@dataclass(frozen=True)
class OptionInfo:
    """What the declaration says of one option besides its name, type and default (the dataclass field's).

    Attributes:
        name: the option's name: the Python keyword and the YAML key (the flag: dashes for underscores).
        default: its default.
        annotation: its type, as the field declares it.
        check: ``check(name, value)`` returns the value checked (or normalized) and raises ValueError naming
            the option; None where the whole config checks it (the algorithm and aggregator, resolved together).
        help: one or two sentences: what it sets (the flag's help and the reference's text).
        trajectory: whether it changes the model a run ends with (so the checkpoint's fingerprint records it).
        example: a valid value other than the default (the tests set each option to it).
        settable: whether YAML files and the command line can set it (False: Python objects only).
        cli_type: the command line's type where it differs from the field's (an enum of choices, ``str`` for
            text parsed by ``parse``).
        parse: turns the command line's or YAML's text into the value (``"mu=1.0"`` into a mapping), or None.
        flag: the command line's flag (``--name`` with dashes, or ``--resume/--fresh`` for a switch).
        aliases: older names, still read with a DeprecationWarning for one release.
    """

    name: str
    default: Any
    annotation: Any
    check: Callable[[str, Any], Any] | None
    help: str
    trajectory: bool
    example: Any
    settable: bool = True
    cli_type: Any = None
    parse: Callable[[str], Any] | None = None
    flag: str = ""
    aliases: tuple[str, ...] = ()


def option(default: Any, check: Callable[[str, Any], Any] | None, help: str, *, trajectory: bool,  # noqa: A002
           example: Any, settable: bool = True, cli_type: Any = None, parse: Callable[[str], Any] | None = None,
           flag: str = "", aliases: tuple[str, ...] = ()) -> Any:
    """A dataclass field declaring an option (see :class:`OptionInfo` for the arguments)."""
    info = dict(check=check, help=help, trajectory=trajectory, example=example, settable=settable,
                cli_type=cli_type, parse=parse, flag=flag, aliases=aliases)
    return dataclasses.field(default=default, metadata={"option": info})


def declared(cls: type) -> dict[str, OptionInfo]:
    """The options declared by the fields of dataclass ``cls``, by name, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if "option" in f.metadata:
            info = dict(f.metadata["option"])
            info["flag"] = info["flag"] or "--" + f.name.replace("_", "-")
            out[f.name] = OptionInfo(name=f.name, default=f.default, annotation=hints[f.name], **info)
    return out


def text(name: str, value: Any) -> str:
    """``value`` as a name (non-empty text, stripped); else ValueError naming the option."""
    if isinstance(value, enum.Enum):  # a choice the command line parsed
        value = value.value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a name (text). Received: {name}={value!r}")
    return str(value).strip()


def optional_text(name: str, value: Any) -> str | None:
    """:func:`text`, or None."""
    return None if value is None else text(name, value)


def rename_deprecated(values: dict[str, Any], options: dict[str, OptionInfo], where: str) -> dict[str, Any]:
    """``values`` with each option's older name (:attr:`OptionInfo.aliases`) replaced by its name, with a
    DeprecationWarning naming both; ValueError when both names are given."""
    out = dict(values)
    for info in options.values():
        for alias in info.aliases:
            out = take_renamed(out, alias, info.name, where, stacklevel=4)
    return out
