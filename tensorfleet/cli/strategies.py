"""``tensorfleet strategies``: list the distribution strategies and show one."""

from __future__ import annotations

import typer

__all__ = ["NAME", "app"]

NAME = "strategies"
app = typer.Typer(help="Distribution strategies: list them, show one.", no_args_is_help=True)


@app.command("list")
def list_strategies() -> None:
    """Every registered strategy: name, aliases, whether it runs here, description."""
    from tensorfleet import strategies

    rows = []
    for name in strategies.available():
        entry, availability = strategies.info(name)
        rows.append((entry.name, ", ".join(entry.aliases) or "-", "yes" if availability.ok else "no",
                     availability.reason, entry.description))
    headers = ("NAME", "ALIASES", "HERE", "WHY", "DESCRIPTION")
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(4)]
    for row in [headers, *rows]:
        typer.echo("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])


@app.command("show")
def show(name: str = typer.Argument(..., help="A strategy name or alias.")) -> None:
    """Description, options with defaults, and whether NAME runs on this machine."""
    from tensorfleet import strategies

    entry, availability = strategies.info(name)
    typer.echo(strategies.describe(entry.name))
    typer.echo(f"  runs here: {'yes' if availability.ok else 'no'} ({availability.reason})")
    if entry.name == "auto":
        chosen, reason = strategies.choose()
        typer.echo(f"  here it would choose: {chosen} ({reason})")
