"""``tensorfleet info``: the versions in this environment and which features can run here, and why not."""

from __future__ import annotations

import json

import typer

__all__ = ["NAME", "register", "info_command"]

NAME = "info"


def info_command(
    as_json: bool = typer.Option(False, "--json", help="Print the versions and features as JSON."),
) -> None:
    """Print Python's and the libraries' versions, then each feature: available, or why not and how to get it, and
    whether it runs Keras 3 and tf_keras models here."""
    from tensorfleet.capabilities import probe_all, versions

    found, probes = versions(), probe_all()
    if as_json:
        typer.echo(json.dumps({"versions": found, "features": [
            {"key": p.key, "title": p.title, "available": p.available, "reason": p.reason, "keras3": p.keras3,
             "keras2": p.keras2} for p in probes]}, indent=2))
        return
    typer.echo("  ".join(f"{name} {value}" for name, value in found.items() if value != "-"))
    width = max(len(p.title) for p in probes)
    typer.echo(f"{'':3}  {'feature':{width}}  Keras 3  tf_keras")
    for p in probes:
        cells = "  ".join(f"{_cell(value):{size}}" for value, size in ((p.keras3, 7), (p.keras2, 8)))
        why = "; ".join([p.reason] * bool(p.reason) + [f"{name}: {value}" for name, value in (
            ("Keras 3", p.keras3), ("tf_keras", p.keras2)) if _cell(value) == "no"])
        typer.echo((f"{'yes' if p.available else 'no ':3}  {p.title:{width}}  {cells}"
                    + (f"  ({why})" if why else "")).rstrip())


def _cell(value: str) -> str:
    """A Keras cell as the matrix prints it: yes, - (takes no Keras model) or no (the value says why)."""
    return value if value in ("yes", "-") else "no"


def register(app: typer.Typer) -> None:
    app.command("info")(info_command)
