"""``tensorfleet info``: the versions in this environment and which features can run here, and why not."""

from __future__ import annotations

import json

import typer

__all__ = ["NAME", "register", "info_command"]

NAME = "info"


def info_command(
    as_json: bool = typer.Option(False, "--json", help="Print the versions and features as JSON."),
) -> None:
    """Print Python's and the libraries' versions, then each feature: available, or why not and how to get it."""
    from tensorfleet.capabilities import probe_all, versions

    found, probes = versions(), probe_all()
    if as_json:
        typer.echo(json.dumps({"versions": found, "features": [
            {"key": p.key, "title": p.title, "available": p.available, "reason": p.reason} for p in probes]}, indent=2))
        return
    typer.echo("  ".join(f"{name} {value}" for name, value in found.items() if value != "-"))
    width = max(len(p.title) for p in probes)
    for p in probes:
        typer.echo(f"{'yes' if p.available else 'no ':3}  {p.title:{width}}" + (f"  ({p.reason})" if p.reason else ""))


def register(app: typer.Typer) -> None:
    app.command("info")(info_command)
