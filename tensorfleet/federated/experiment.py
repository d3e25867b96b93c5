"""One federated experiment from plain settings (the CLI flags and the YAML config keys).

Every key is checked for its type and range when the settings are resolved, and a bad one is
named: ``rounds: 2.5`` is refused (not rounded), ``progress: "no"`` is refused (not taken for
true), a YAML file that does not parse is reported with its line, and ``out`` must be a
directory that can be written.

Example:
    >>> resolve_config({"rounds": 2.5})
    Traceback (most recent call last):
    ValueError: rounds must be a positive integer. Received: rounds=2.5
    >>> history = run_experiment({"dataset": "digits", "clients": 100, "partition": "dirichlet:0.3",
    ...                           "algorithm": "fedavg", "rounds": 20, "out": "runs/a"})  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable

from tensorfleet.federated.config import check_out_dir
from tensorfleet.validation import boolean, integer, number, positive_int

__all__ = ["DEFAULTS", "KEYS", "load_config", "resolve_config", "run_experiment", "build_simulation"]

# None: the dataset decides (clients: 100 for a pooled dataset, all of a TFF dataset's own;
# clients_per_round: 10, or all training clients when fewer).
DEFAULTS: dict[str, Any] = {
    "model": "digits_mlp", "dataset": "digits", "clients": None, "partition": None, "algorithm": "fedavg",
    "rounds": 10, "clients_per_round": None, "dropout": 0.0, "straggler_deadline": None, "dp": None,
    "aggregator": None, "out": None, "seed": 0, "batch_size": 20, "local_epochs": 1, "client_lr": None,
    "server_lr": None, "eval_every": 1, "eval_clients": 0, "checkpoint_every": 0, "progress": True, "resume": True,
    "backend": "auto", "straggler_share": 0.0, "straggler_policy": "drop", "non_trainable": "mean",
}
KEYS = tuple(DEFAULTS)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a name (text). Received: {name}={value!r}")
    return value


def _dp(name: str, value: Any) -> Any:
    if not isinstance(value, (str, dict)):
        raise ValueError(f"{name} must be options such as 'noise_multiplier=1.0,clip=0.5' or a mapping of them. "
                         f"Received: {name}={value!r}")
    return value


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "model": _text, "dataset": _text, "clients": positive_int, "partition": _text, "algorithm": _text,
    "rounds": positive_int, "clients_per_round": positive_int,
    "dropout": lambda k, v: number(k, v, minimum=0, below=1), "straggler_deadline": lambda k, v: number(k, v, above=0),
    "dp": _dp, "aggregator": _text, "out": lambda k, v: str(check_out_dir(k, v)),
    "seed": lambda k, v: integer(k, v, minimum=0), "batch_size": positive_int, "local_epochs": positive_int,
    "client_lr": lambda k, v: number(k, v, above=0), "server_lr": lambda k, v: number(k, v, above=0),
    "eval_every": positive_int, "eval_clients": lambda k, v: integer(k, v, minimum=0),
    "straggler_share": lambda k, v: number(k, v, minimum=0, maximum=1), "straggler_policy": _text,
    "non_trainable": _text,
    "checkpoint_every": lambda k, v: integer(k, v, minimum=0), "progress": boolean, "resume": boolean,
    "backend": _text,
}


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a YAML mapping of the keys in :data:`KEYS` (dashes or underscores)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"No config file at {p}.")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"The config file {p} is not valid YAML{where}: {problem}.") from None
    if not isinstance(data, dict):
        raise ValueError(f"A config file must hold a mapping of keys to values. Received: {type(data).__name__} in {p}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in, every value checked; an unknown key or a bad value raises ValueError naming it."""
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"Unknown config key {unknown[0]!r}. Known keys: {', '.join(KEYS)}.")
    given = {k: _CHECKS[k](k, v) for k, v in config.items() if v is not None}
    return {**DEFAULTS, **given}


def _aggregator(cfg: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """``(aggregator name, options)`` from the ``dp`` or ``aggregator`` key (None: the algorithm's mean)."""
    from tensorfleet.federated.aggregators import AGGREGATORS, parse_options

    if cfg["dp"] and cfg["aggregator"]:
        raise ValueError(f"Use either dp or aggregator, not both. Received: dp={cfg['dp']!r}, "
                         f"aggregator={cfg['aggregator']!r}")
    if cfg["dp"]:
        spec, key = cfg["dp"], "dp"
        if isinstance(spec, dict):
            options = dict(spec)
            kind = "dp_adaptive" if boolean("dp.adaptive", options.pop("adaptive", False)) else "dp_fixed"
        else:
            kind = "dp_fixed"
            if spec.startswith(("adaptive", "fixed")):
                head, _, spec = spec.partition(":")
                kind = f"dp_{head}"
            options = parse_options(spec)
    elif cfg["aggregator"]:
        name, _, opts = cfg["aggregator"].partition(":")
        kind, options, key = AGGREGATORS.canonical(name), parse_options(opts), "aggregator"
    else:
        return None, {}
    try:
        AGGREGATORS.get(kind).given(kind, options)
    except TypeError as error:  # an option named in text: a problem with the settings, not a call
        raise ValueError(f"{key}: {error}") from None
    return kind, options


def build_simulation(config: dict[str, Any], *, workers: str | list[str] | None = None) -> Any:
    """The :class:`~tensorfleet.federated.Simulation` a config describes, on TFF ``workers`` when given."""
    from tensorfleet import models
    from tensorfleet.federated.clients.datasets import load_federated
    from tensorfleet.federated.simulation import Simulation

    cfg = resolve_config(config)
    model_fn, flat = _model_fn(cfg["model"])
    clients, test = load_federated(cfg["dataset"], num_clients=cfg["clients"], scheme=cfg["partition"],
                                   seed=cfg["seed"], flat=flat)
    if model_fn is None:  # a zoo model, built for the data's shape in the Keras of this process
        name, x_shape = cfg["model"], tuple(clients.element_type_structure["x"].shape)
        params = inspect.signature(models.MODELS.get(name)).parameters
        model_kwargs: dict[str, Any] = {"input_dim": x_shape[0]} if flat else (
            {"input_shape": x_shape} if "input_shape" in params else {})

        def model_fn() -> Any:
            return models.build(name, **model_kwargs)
    aggregator, options = _aggregator(cfg)
    algorithm, algorithm_options = _algorithm(cfg["algorithm"])
    per_round = cfg["clients_per_round"] or max(1, min(10, len(clients.client_ids) - cfg["eval_clients"]))
    return Simulation(
        model_fn, clients, algorithm, algorithm_options=algorithm_options, rounds=cfg["rounds"],
        clients_per_round=per_round, seed=cfg["seed"], batch_size=cfg["batch_size"],
        local_epochs=cfg["local_epochs"], client_learning_rate=cfg["client_lr"],
        server_learning_rate=cfg["server_lr"], aggregator=aggregator, aggregator_options=options,
        dropout=cfg["dropout"], straggler_deadline=cfg["straggler_deadline"], straggler_share=cfg["straggler_share"],
        straggler_policy=cfg["straggler_policy"], non_trainable=cfg["non_trainable"], test_data=test,
        eval_clients=cfg["eval_clients"] or None, eval_every=cfg["eval_every"], out_dir=cfg["out"],
        checkpoint_every=cfg["checkpoint_every"], progress=cfg["progress"], resume=cfg["resume"],
        backend=cfg["backend"], workers=workers)


def _algorithm(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value,...`` (``fedprox:mu=1.0``, as ``tensorfleet federated algorithms`` prints the
    options) as ``(name, algorithm_options)``; the options are checked by the algorithm."""
    from tensorfleet.federated.aggregators import parse_options
    from tensorfleet.federated.algorithms import resolve

    name, _, opts = spec.partition(":")
    options = parse_options(opts)
    try:
        resolve(name.strip(), **options)
    except TypeError as error:  # an option named in text: a problem with the settings, not a call
        raise ValueError(f"algorithm: {error}") from None
    return name.strip(), options


def _model_fn(spec: str) -> tuple[Callable[[], Any] | None, bool]:
    """``(model_fn, flat)`` for the ``model`` key: a saved model file (``.keras``/``.h5`` of either Keras) is
    loaded afresh by each call, by the Keras that wrote it, and starts the run from its weights; a zoo name gives
    ``(None, flat)``, built once the data's shape is known. ``flat``: whether the model takes flat vectors."""
    from tensorfleet import models
    from tensorfleet.compat.keras import load_model

    path = models.model_file(spec)
    if path is None:
        params = inspect.signature(models.MODELS.get(spec)).parameters
        return None, "input_dim" in params and "input_shape" not in params
    if not path.is_file() or path.suffix not in models.MODEL_FILE_SUFFIXES:
        raise ValueError(f"model must be a zoo name or a saved Keras model file ({', '.join(models.MODEL_FILE_SUFFIXES)}"
                         f"). Received: model={spec!r} ({'a folder' if path.is_dir() else 'another kind of file'})")
    where = f"the federated model {path}"
    probe = load_model(path, compile=False, where=where)
    shape = probe.input_shape
    if isinstance(shape, list) or not isinstance(shape, tuple):
        raise ValueError(f"A federated model takes one input; {path} takes {shape}.")

    def model_fn() -> Any:
        return load_model(path, compile=False, where=where)

    return model_fn, len(shape) == 2


def run_experiment(config: dict[str, Any]) -> Any:
    """Builds and runs the simulation of ``config``; returns its history."""
    return build_simulation(config).run()
