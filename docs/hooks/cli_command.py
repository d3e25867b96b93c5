"""The ``tensorfleet`` command as a click command, for mkdocs-click (``docs/ref-cli.md``).

typer builds the click command from the app; the reference lists every command and option from it,
so it cannot drift from the code. The page uses mkdocs-click's plain style: its table style finds
options with ``isinstance(param, click.Option)``, which typer's own copy of click (typer >= 0.26)
does not pass, so it would list none.
"""

from __future__ import annotations

import typer

from tensorfleet.cli.main import app

command = typer.main.get_command(app)
