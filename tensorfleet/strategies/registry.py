"""The strategy registry: every distribution strategy is built by name.

``build(name, **options)`` returns the real ``tf.distribute.Strategy`` (nothing wraps it,
so Keras code under ``strategy.scope()`` is plain Keras). Each entry also knows whether it
can run on this machine, which ``tensorfleet strategies list`` shows.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from tensorfleet.registry import Entry, Registry

__all__ = [
    "STRATEGIES",
    "Availability",
    "available",
    "build",
    "describe",
    "info",
    "register",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Availability:
    """Whether a strategy can run here, and why (or why not)."""

    ok: bool
    reason: str


STRATEGIES: Registry[Callable[..., Any]] = Registry("strategy")


def register(
    name: str,
    factory: Callable[..., Any],
    *,
    description: str = "",
    aliases: tuple[str, ...] = (),
    check: Callable[[], Availability] | None = None,
    override: bool = False,
) -> Callable[..., Any]:
    """Registers a strategy factory under ``name``.

    Args:
        name: the name users pass to :func:`build`.
        factory: callable taking keyword options and returning a ``tf.distribute.Strategy``.
        description: one line for ``tensorfleet strategies list``.
        aliases: other names that resolve to this one.
        check: returns an :class:`Availability` for this machine; default "yes".

    Example (the last line removes the entry again, so the registry stays as it was):
        >>> import tensorflow as tf
        >>> factory = register("first_cpu", lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
        ...                    description="OneDeviceStrategy on the first CPU")
        >>> build("first_cpu").extended.worker_devices
        ('/job:localhost/replica:0/task:0/device:CPU:0',)
        >>> print(describe("first_cpu"))
        first_cpu: OneDeviceStrategy on the first CPU
          options: (none)
        >>> _ = STRATEGIES.unregister("first_cpu")
    """
    return STRATEGIES.register(name, factory, description=description, aliases=aliases,
                               override=override, check=check)


def build(name: str = "auto", **options: Any) -> Any:
    """Builds the strategy ``name`` with validated ``options``.

    Args:
        name: a registered name or alias (``available()`` lists them); ``"auto"`` picks
            from the environment.
        **options: the factory's keyword options (see ``describe(name)``).

    Returns:
        A ``tf.distribute.Strategy``.

    Raises:
        UnknownNameError: ``name`` is not registered (the message lists the names).
        TypeError: an option the strategy does not take.
        ValueError: an option value the strategy cannot use.

    Example:
        >>> import tensorfleet as tfl
        >>> strategy = tfl.strategies.build("mirrored", devices=["/cpu:0"])
        >>> strategy.num_replicas_in_sync
        1
        >>> with strategy.scope():
        ...     model = tfl.models.build("digits_cnn")
        >>> model.distribute_strategy is strategy
        True
    """
    entry = STRATEGIES.entry(name)
    _check_options(entry, options)
    _drop_blank_tf_config()
    return entry.obj(**options)


def _drop_blank_tf_config() -> None:
    """Removes a TF_CONFIG that is set but blank.

    tensorfleet reads a blank TF_CONFIG as "no cluster", but TensorFlow's strategies parse it as
    JSON and fail ("Expecting value: line 1 column 1") when it is merely empty, as it is after
    ``export TF_CONFIG=`` or in a template with the value left out.
    """
    if "TF_CONFIG" in os.environ and not os.environ["TF_CONFIG"].strip():
        log.debug("Ignoring the blank TF_CONFIG of the environment.")
        del os.environ["TF_CONFIG"]


def _check_options(entry: Entry[Callable[..., Any]], options: dict[str, Any]) -> None:
    params = inspect.signature(entry.obj).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        elsewhere = "".join(f" {option} is an option of: {', '.join(_taking(option))}." for option in unknown
                            if _taking(option))
        raise TypeError(
            f"Strategy {entry.name!r} does not take option(s) {', '.join(unknown)}. "
            f"Its options are: {', '.join(accepted) or '(none)'}.{elsewhere}"
        )


def _taking(option: str) -> list[str]:
    """The strategies that take ``option`` as a keyword."""
    return [e.name for e in STRATEGIES.entries() if option in inspect.signature(e.obj).parameters
            and inspect.signature(e.obj).parameters[option].kind is not inspect.Parameter.VAR_KEYWORD]


def available() -> list[str]:
    """Canonical names of the registered strategies."""
    return STRATEGIES.names()


def describe(name: str) -> str:
    """The description of strategy ``name`` with its options and their defaults."""
    entry = STRATEGIES.entry(name)
    params = inspect.signature(entry.obj).parameters
    options = ", ".join(
        f"{n}={p.default!r}" if p.default is not inspect.Parameter.empty else n
        for n, p in params.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    aliases = f" (aliases: {', '.join(entry.aliases)})" if entry.aliases else ""
    return f"{entry.name}{aliases}: {entry.description}\n  options: {options or '(none)'}"


def info(name: str) -> tuple[Entry[Callable[..., Any]], Availability]:
    """The registry entry of ``name`` and whether it can run on this machine."""
    entry = STRATEGIES.entry(name)
    check = entry.metadata.get("check")
    if check is None:
        return entry, Availability(True, "runs anywhere")
    try:
        return entry, check()
    except Exception as exc:  # a check must never break a listing
        return entry, Availability(False, f"check failed: {exc}")
