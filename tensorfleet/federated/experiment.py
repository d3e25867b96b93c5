"""One federated experiment from plain settings (the CLI flags and the YAML config keys).

Example:
    >>> history = run_experiment({"dataset": "digits", "clients": 100, "partition": "dirichlet:0.3",
    ...                           "algorithm": "fedavg", "rounds": 20, "out": "runs/a"})
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

__all__ = ["DEFAULTS", "KEYS", "load_config", "resolve_config", "run_experiment", "build_simulation"]

DEFAULTS: dict[str, Any] = {
    "model": "digits_mlp", "dataset": "digits", "clients": 100, "partition": "iid", "algorithm": "fedavg",
    "rounds": 10, "clients_per_round": 10, "dropout": 0.0, "straggler_deadline": None, "dp": None,
    "aggregator": None, "out": None, "seed": 0, "batch_size": 20, "local_epochs": 1, "client_lr": None,
    "server_lr": None, "eval_every": 1, "eval_clients": 0, "checkpoint_every": 0, "progress": True, "backend": "tff",
}
KEYS = tuple(DEFAULTS)


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a YAML mapping of the keys in :data:`KEYS` (dashes or underscores)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"No config file at {p}.")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"A config file must hold a mapping of keys to values. Received: {type(data).__name__} in {p}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in; unknown keys raise ValueError naming the known ones."""
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"Unknown config key {unknown[0]!r}. Known keys: {', '.join(KEYS)}.")
    return {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}


def _aggregator(cfg: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    from tensorfleet.federated.aggregators import AGGREGATORS, parse_options

    if cfg["dp"] and cfg["aggregator"]:
        raise ValueError(f"Use either dp or aggregator, not both. Received: dp={cfg['dp']!r}, "
                         f"aggregator={cfg['aggregator']!r}")
    if cfg["dp"]:
        spec = cfg["dp"]
        if isinstance(spec, dict):
            opts = dict(spec)
            kind = "dp_adaptive" if opts.pop("adaptive", False) else "dp_fixed"
            return kind, opts
        spec = str(spec)
        kind = "dp_fixed"
        if spec.startswith(("adaptive", "fixed")):
            head, _, spec = spec.partition(":")
            kind = f"dp_{head}"
        return kind, parse_options(spec)
    if cfg["aggregator"]:
        name, _, opts = str(cfg["aggregator"]).partition(":")
        return AGGREGATORS.canonical(name), parse_options(opts)
    return None, {}


def build_simulation(config: dict[str, Any], *, workers: str | list[str] | None = None) -> Any:
    """The :class:`~tensorfleet.federated.Simulation` a config describes, on TFF ``workers`` when given."""
    from tensorfleet import models
    from tensorfleet.federated.clients.datasets import load_federated
    from tensorfleet.federated.simulation import Simulation

    cfg = resolve_config(config)
    factory = models.MODELS.get(cfg["model"])
    params = inspect.signature(factory).parameters
    flat = "input_dim" in params and "input_shape" not in params
    clients, test = load_federated(cfg["dataset"], num_clients=int(cfg["clients"]), scheme=str(cfg["partition"]),
                                   seed=int(cfg["seed"]), flat=flat)
    x_shape = tuple(clients.x.shape[1:])
    model_kwargs: dict[str, Any] = {"input_dim": x_shape[0]} if flat else (
        {"input_shape": x_shape} if "input_shape" in params else {})
    name = cfg["model"]
    aggregator, options = _aggregator(cfg)
    return Simulation(
        lambda: models.build(name, **model_kwargs), clients, cfg["algorithm"], rounds=int(cfg["rounds"]),
        clients_per_round=int(cfg["clients_per_round"]), seed=int(cfg["seed"]), batch_size=int(cfg["batch_size"]),
        local_epochs=int(cfg["local_epochs"]), client_learning_rate=cfg["client_lr"],
        server_learning_rate=cfg["server_lr"], aggregator=aggregator, aggregator_options=options,
        dropout=float(cfg["dropout"]), straggler_deadline=cfg["straggler_deadline"], test_data=test,
        eval_clients=int(cfg["eval_clients"]) or None, eval_every=int(cfg["eval_every"]), out_dir=cfg["out"],
        checkpoint_every=int(cfg["checkpoint_every"]), progress=bool(cfg["progress"]), backend=str(cfg["backend"]),
        workers=workers)


def run_experiment(config: dict[str, Any]) -> Any:
    """Builds and runs the simulation of ``config``; returns its history."""
    return build_simulation(config).run()
