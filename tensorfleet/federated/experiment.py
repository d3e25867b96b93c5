"""One federated experiment from plain settings (the YAML config keys and the flags of ``tensorfleet federated
run``).

The keys are the options of :class:`~tensorfleet.federated.config.SimulationConfig` that text can set, plus the
experiment's own (:class:`ExperimentKeys`: the model and the data), all declared once
(:mod:`~tensorfleet.federated.options`). Every key is checked for its type and range when the settings are
resolved, and a bad one is named: ``rounds: 2.5`` is refused (not rounded), ``progress: "no"`` is refused (not
taken for true), a YAML file that does not parse is reported with its line, and ``out_dir`` must be a directory
that can be written. Older key names (``out``, ``client_lr``, ``server_lr``) are read with a DeprecationWarning.

Example:
    >>> resolve_config({"rounds": 2.5})
    Traceback (most recent call last):
    ValueError: rounds must be a positive integer. Received: rounds=2.5
    >>> history = run_experiment({"dataset": "digits", "clients": 100, "partition": "dirichlet:0.3",
    ...                           "algorithm": "fedprox:mu=1.0", "rounds": 20, "out_dir": "runs/a"})  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from tensorfleet.federated.config import SimulationConfig
from tensorfleet.federated.options import OptionInfo, declared, option, optional_text, rename_deprecated, text
from tensorfleet.io import unique_keys_loader
from tensorfleet.validation import boolean, integer, positive_int

__all__ = ["DEFAULTS", "ExperimentKeys", "KEYS", "OPTIONS", "build_simulation", "load_config", "resolve_config",
           "run_experiment"]


def _dp(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, (str, dict)):
        raise ValueError(f"{name} must be options such as 'noise_multiplier=1.0,clip=0.5' or a mapping of them. "
                         f"Received: {name}={value!r}")
    return value


@dataclass(frozen=True)
class ExperimentKeys:
    """The keys of an experiment besides the simulation's options: the model and the data it trains on."""

    model: str = option(
        "digits_mlp", text, "A zoo model name, built in the Keras of this process, or a saved Keras model file "
        "(.keras, .h5: either Keras; the run starts from its weights).", trajectory=True, example="digits_cnn")
    dataset: str = option("digits", text, "digits | emnist-synthetic (TFF's own 2 clients; tff track).",
                          trajectory=True, example="emnist-synthetic")
    clients: Optional[int] = option(
        None, lambda k, v: None if v is None else positive_int(k, v),
        "Clients to split digits into (default 100); of a TFF dataset, the first N.", trajectory=True, example=20)
    partition: Optional[str] = option(
        None, optional_text, "iid (default) | dirichlet:ALPHA | shards:K | quantity:BETA (digits).",
        trajectory=True, example="dirichlet:0.5")
    eval_clients: int = option(0, lambda k, v: integer(k, v, minimum=0),
                               "Clients held out for federated evaluation (the last ids).", trajectory=True,
                               example=4)
    dp: Any = option(None, _dp, "Differential privacy: 'noise_multiplier=1.0,clip=0.5' or "
                     "'adaptive:noise_multiplier=0.5' (in YAML also a mapping); excludes aggregator.",
                     trajectory=True, example="noise_multiplier=1.0,clip=0.5", cli_type=str)


# Where the experiment's default differs from the simulation's: None, the dataset decides (10, or all the
# training clients when fewer).
_EXPERIMENT_DEFAULTS = {"clients_per_round": None}

OPTIONS: dict[str, OptionInfo] = {
    **declared(ExperimentKeys),
    **{name: info for name, info in declared(SimulationConfig).items() if info.settable},
}
"""Every key of an experiment, by name: its declaration (:class:`~tensorfleet.federated.options.OptionInfo`)."""
KEYS = tuple(OPTIONS)
DEFAULTS: dict[str, Any] = {name: _EXPERIMENT_DEFAULTS.get(name, info.default) for name, info in OPTIONS.items()}


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a YAML mapping of the keys in :data:`KEYS` (dashes or underscores).

    Raises:
        FileNotFoundError: no file at ``path`` (nothing, or a folder).
        ValueError: the file is empty, not text (:class:`~tensorfleet.io.UnreadableFileError`), not YAML, or not a
            mapping; the message names the file.
    """
    import yaml

    from tensorfleet.io import read_text

    p = Path(path)
    text = read_text(p, "a YAML config file (a mapping of the run's keys)")
    try:
        data = yaml.load(text, Loader=unique_keys_loader())  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"The config file {p} is not valid YAML{where}: {problem}.") from None
    if data is None:
        raise ValueError(f"The config file {p} holds no keys (comments only); expected a YAML mapping of the run's "
                         "keys.")
    if not isinstance(data, dict):
        raise ValueError(f"A config file must hold a mapping of keys to values. Received: {type(data).__name__} in {p}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in, every value checked; an unknown key or a bad value raises ValueError naming it."""
    config = rename_deprecated(config, OPTIONS, "federated experiment")
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"Unknown config key {unknown[0]!r}. Known keys: {', '.join(KEYS)}.")
    given = {}
    for key, value in config.items():
        if value is None:
            continue
        check = OPTIONS[key].check or text
        checked = check(key, value)
        given[key] = str(checked) if isinstance(checked, Path) else checked
    return {**DEFAULTS, **given}


def _aggregator(cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(aggregator, options)`` from the ``dp`` or ``aggregator`` key (None: the algorithm's mean)."""
    from tensorfleet.federated.aggregators import parse_options

    if cfg["dp"] and cfg["aggregator"]:
        raise ValueError(f"Use either dp or aggregator, not both. Received: dp={cfg['dp']!r}, "
                         f"aggregator={cfg['aggregator']!r}")
    if not cfg["dp"]:
        return cfg["aggregator"], cfg["aggregator_options"]
    spec = cfg["dp"]
    if isinstance(spec, dict):
        options = dict(spec)
        return ("dp_adaptive" if boolean("dp.adaptive", options.pop("adaptive", False)) else "dp_fixed"), options
    kind = "dp_fixed"
    if spec.startswith(("adaptive", "fixed")):
        head, _, spec = spec.partition(":")
        kind = f"dp_{head}"
    return kind, parse_options(spec)


def build_simulation(config: dict[str, Any], *, workers: str | list[str] | None = None) -> Any:
    """The :class:`~tensorfleet.federated.Simulation` a config describes (``workers``: TFF workers to run the
    rounds on, as the ``workers`` key)."""
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

    options = {name: cfg[name] for name, info in declared(SimulationConfig).items() if info.settable}
    options["aggregator"], options["aggregator_options"] = _aggregator(cfg)
    options["clients_per_round"] = cfg["clients_per_round"] or max(1, min(10, len(clients.client_ids) -
                                                                           cfg["eval_clients"]))
    if workers is not None:
        options["workers"] = workers
    return Simulation(model_fn, clients, test_data=test, eval_clients=cfg["eval_clients"] or None, **options)


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
        raise ValueError("model must be a zoo name or a saved Keras model file "
                         f"({', '.join(models.MODEL_FILE_SUFFIXES)}). Received: model={spec!r} "
                         f"({'a folder' if path.is_dir() else 'another kind of file'})")
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
