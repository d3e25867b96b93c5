"""Entry point of the ``tensorfleet`` command.

Each command group lives in its own module of this package and exposes ``app`` (a
``typer.Typer``) and ``NAME``; top-level commands (such as ``launch``) expose ``register(app)``.
Errors that tensorfleet raises for bad input (``ValueError`` and its subclasses, such as
:class:`~tensorfleet.registry.UnknownNameError`; ``FileNotFoundError``; a Keras 3 model where
Keras 2 is needed, :class:`~tensorfleet.compat.keras.Keras3ModelError`) are turned into one clean
``error:`` line on stderr and exit status 2 here, at the CLI boundary, instead of a traceback.
Anything else (a ``TypeError``, ``KeyError`` or ``AttributeError`` raised by tensorfleet's own
code is a bug, not bad input) keeps its traceback, followed by a line asking to report it, and
exits with status 1.

Every command shows what the user needs and nothing else: TensorFlow's C++ logs below ERROR are
off (``TF_CPP_MIN_LOG_LEVEL=2`` unless the user set it), and the lines TensorFlow prints on
every start or conversion that say nothing (:data:`tensorfleet.cluster.console.NOISE`, among
them TensorFlow 2.21's absl, oneDNN, CUDA-stub and cuInit lines and 2.14's three "Unable to register
cuDNN/cuFFT/cuBLAS factory" errors, which level 2 keeps) are
filtered out of stderr and out of launched tasks' output. ``tensorfleet --verbose <command>``
shows everything: C++ logs at every level, those lines, and INFO logs.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import traceback
import warnings
from typing import Any, Iterator, Optional

import typer

import tensorfleet

__all__ = ["app", "main", "click_exceptions", "usage_message", "user_errors", "verbose", "GROUPS", "COMMANDS",
           "REPORT_BUG"]

# Command groups: ``tensorfleet <NAME> ...``; each module defines NAME and app.
GROUPS: tuple[str, ...] = ("strategies", "k8s", "edge", "federated", "serving", "profile")
# Top-level commands: each module defines register(app).
COMMANDS: tuple[str, ...] = ("launch", "plan", "serve", "tune", "info")

app = typer.Typer(
    name="tensorfleet",
    help="Distributed, federated and on-device TensorFlow from plain Keras.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tensorfleet {tensorfleet.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Optional[bool] = typer.Option(  # noqa: UP007 - typer needs Optional here
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", help="Show everything: TensorFlow's C++ logs and start-up lines, INFO logs."),
    imports: list[str] = typer.Option(
        [], "--import", metavar="MODULE",
        help="Import MODULE first (a module name, or a .py file): the module that defines a model's own layers, "
             "for a .keras file that uses them. Repeatable."),
) -> None:
    """Distributed, federated and on-device TensorFlow from plain Keras."""
    from tensorfleet.cluster.console import quiet_stderr

    # Before any command imports TensorFlow, which reads the level once; the user's setting wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "2")
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ctx.with_resource(quiet_stderr(enabled=not verbose))
    for name in imports:  # after the filter: a module that imports Keras starts TensorFlow, whose lines it drops
        import_user_module(name)


def import_user_module(name: str) -> Any:
    """``--import NAME``: the module ``NAME`` (found from the current folder too, as ``python -m`` finds it) or
    the Python file ``NAME``. One clear error when there is no such module, and when importing it fails (the
    error and the line of the user's code that raised it)."""
    import importlib.util

    path = os.path.abspath(name)
    failure: Exception
    if name.endswith(".py") and not os.path.isfile(path):
        raise FileNotFoundError(f"--import {name}: no such Python file. Give a module name (my_layers) or the path "
                                "of a .py file.")
    try:
        if name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name.split(".")[0]:
            raise ValueError(f"--import {name}: no module {name!r} on the Python path or in the current folder "
                             f"({os.getcwd()}). Give the module that defines the model's layers, or its .py file."
                             ) from None
        failure = error
    except Exception as error:  # the user's module raised: its error and where, not a bug of tensorfleet's
        failure = error
    frames = traceback.extract_tb(failure.__traceback__)
    # (a SyntaxError names its file and line itself)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames and not isinstance(failure, SyntaxError) \
        else ""
    raise ValueError(f"--import {name} failed: {type(failure).__name__}: {failure}{where}") from None


def verbose(ctx: typer.Context) -> bool:
    """Whether ``tensorfleet --verbose`` was given (for commands that start processes)."""
    return bool(ctx.find_root().params.get("verbose"))


for _module_name in GROUPS:
    _module = importlib.import_module(f"tensorfleet.cli.{_module_name}")
    app.add_typer(_module.app, name=_module.NAME)
for _module_name in COMMANDS:
    importlib.import_module(f"tensorfleet.cli.{_module_name}").register(app)


REPORT_BUG = "This is a bug in tensorfleet, not a problem with your input; please report it with the traceback above."
"""The line printed after the traceback of an unexpected error."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean bad input: exit status 2 with one ``error:`` line."""
    from tensorfleet.compat.keras import Keras3ModelError

    return ValueError, FileNotFoundError, Keras3ModelError


def click_exceptions() -> Any:
    """The click exceptions module typer uses (vendored by typer >= 0.26)."""
    try:  # typer >= 0.26 vendors click
        from typer._click import exceptions as vendored
    except ImportError:  # pragma: no cover - older typer
        from click import exceptions
        return exceptions
    return vendored


# The words every warning about an older name or flag ends with (tensorfleet.validation.take_renamed and kin).
OLDER_NAME = "will stop working in the next release"


@contextlib.contextmanager
def warnings_shown() -> Iterator[None]:
    """tensorfleet's warnings for the user shown as one ``warning: ...`` line on stderr each: those about an older
    name (a DeprecationWarning, which Python's default filters hide outside ``__main__``) and the edge room's
    (:class:`~tensorfleet.edge.errors.EdgeWarning`); every other warning (numpy's, TensorFlow's) as before."""
    from tensorfleet.edge.errors import EdgeWarning

    with warnings.catch_warnings():
        previous = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if issubclass(category, EdgeWarning) or (issubclass(category, DeprecationWarning)
                                                     and OLDER_NAME in str(message)):
                typer.echo(f"warning: {message}", err=True)
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.filterwarnings("always", message=f".*{OLDER_NAME}", category=DeprecationWarning)
        warnings.filterwarnings("always", category=EdgeWarning)
        warnings.showwarning = show
        yield


def usage_message(exc: Any, argv: list[str]) -> str:
    """A command-line usage error (click's) in tensorfleet's words: what is wrong and, for a flag's value that
    did not parse, the value received. The wrapper's own words ("Value error, ") are left out."""
    message = exc.format_message().replace("Value error, ", "").rstrip()
    param = getattr(exc, "param", None)
    opts = [o for o in getattr(param, "opts", []) + getattr(param, "secondary_opts", []) if o.startswith("-")]
    if isinstance(exc, click_exceptions().BadParameter) and opts and "Received" not in message:
        for i, arg in enumerate(argv):
            flag, sep, value = arg.partition("=")
            if flag in opts and (sep or i + 1 < len(argv)):
                message = f"{message.rstrip('.')}. Received: {flag} {value if sep else argv[i + 1]!r}"
                break
    return message


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; input errors print ``error: ...`` and exit with status 2, a bug shows its
    traceback and :data:`REPORT_BUG` and exits with status 1."""
    exceptions = click_exceptions()
    try:
        with warnings_shown():
            result = app(args=argv, standalone_mode=False)
    except user_errors() as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except exceptions.UsageError as exc:  # a flag unknown, missing, or of the wrong type: the same one line
        typer.echo(f"error: {usage_message(exc, sys.argv[1:] if argv is None else argv)}", err=True)
        return exc.exit_code
    except exceptions.ClickException as exc:
        exc.show()
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        return 130
    except Exception:
        traceback.print_exc()
        typer.echo(REPORT_BUG, err=True)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
