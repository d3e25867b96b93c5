"""The federated round loop: :class:`Simulation`.

A :class:`Simulation` wraps a plain Keras model (``model_fn`` returns an uncompiled
``tf.keras.Model``) with ``tff.learning.models.from_keras_model`` (the input spec comes from the
client data), builds the algorithm's ``tff.learning`` process, and runs rounds on a TFF worker it
owns (:mod:`tensorfleet.federated.backends.tff`):

* seeded client sampling (round ``r`` draws from ``default_rng([seed, r])``, so a resumed run
  samples as an uninterrupted one), a per-round dropout rate and a straggler deadline on
  simulated client latencies: clients that do not report are left out of that round's aggregate;
* evaluation on central test data and federated evaluation on held-out clients every
  ``eval_every`` rounds;
* metrics per round in ``metrics.json`` / ``metrics.csv`` and TensorBoard, PNG plots of accuracy
  and loss, a tqdm progress bar with the current metrics;
* a checkpoint every ``checkpoint_every`` rounds (atomic); a run started again with the same
  arguments and ``out_dir`` resumes from its last checkpoint, and a checkpoint of another
  configuration is refused.

Example (two quick rounds; the digits MLP is already well above chance, 0.1):
    >>> import os
    >>> import tensorfleet as tfl
    >>> split = tfl.models.datasets.load_digits(flat=True)
    >>> clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=10, scheme="iid")
    >>> sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp"), clients, "fedavg",
    ...                                rounds=2, clients_per_round=5, progress=False,
    ...                                test_data=(split.x_test, split.y_test), out_dir="runs/fedavg")
    >>> history = sim.run()
    >>> history.column("round")
    [1, 2]
    >>> history.final("test_accuracy") > 0.3
    True
    >>> sorted(os.listdir("runs/fedavg"))
    ['accuracy.png', 'loss.png', 'metrics.csv', 'metrics.json', 'tensorboard']
"""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tensorfleet.io import save_figure, write_bytes, write_json, write_text
from tensorfleet.validation import choice

__all__ = ["Simulation", "History", "Backend", "CheckpointMismatchError", "plot_history", "load_history",
           "default_latency"]

_CHECKPOINT = "checkpoint.npz"
_HISTORY = "metrics.json"


class Backend(str, Enum):
    """Where rounds run: on TFF's runtime, or compiled into one TensorFlow function (see fast.py)."""

    TFF = "tff"
    COMPILED = "compiled"


class CheckpointMismatchError(ValueError):
    """A checkpoint in ``out_dir`` was written by a simulation of another configuration."""


@dataclass
class History:
    """Per-round metrics of a simulation.

    Attributes:
        rounds: one dict per completed round (``round``, ``train_loss``, ``train_accuracy``,
            ``clients``, ``participants``, ``test_accuracy`` when evaluated, ...).
        config: the configuration the run was made with.
    """

    rounds: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def column(self, key: str) -> list[Any]:
        """Values of ``key`` over the rounds that have it."""
        return [r[key] for r in self.rounds if r.get(key) is not None]

    def final(self, key: str) -> Any:
        """The last recorded value of ``key``; KeyError when no round has it."""
        values = self.column(key)
        if not values:
            raise KeyError(f"No round recorded {key!r}. Recorded keys: {sorted({k for r in self.rounds for k in r})}")
        return values[-1]

    def rounds_to(self, key: str, target: float) -> int | None:
        """The first round whose ``key`` reaches ``target``, or None."""
        for r in self.rounds:
            if r.get(key) is not None and r[key] >= target:
                return int(r["round"])
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config, "rounds": self.rounds}

    def to_csv(self) -> str:
        keys: list[str] = []
        for r in self.rounds:
            keys.extend(k for k in r if k not in keys)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        for r in self.rounds:
            writer.writerow(r)
        return buffer.getvalue()

    def save(self, out_dir: str | os.PathLike[str]) -> None:
        """Writes ``metrics.json`` and ``metrics.csv`` into ``out_dir`` (atomically)."""
        write_json(Path(out_dir) / _HISTORY, self.as_dict())
        write_text(Path(out_dir) / "metrics.csv", self.to_csv())


def load_history(out_dir: str | os.PathLike[str]) -> History:
    """Reads the ``metrics.json`` a simulation wrote into ``out_dir``."""
    path = Path(out_dir) / _HISTORY
    if not path.is_file():
        raise FileNotFoundError(f"No {_HISTORY} in {out_dir}; is it the out_dir of a simulation run?")
    data = json.loads(path.read_text())
    return History(rounds=data["rounds"], config=data.get("config", {}))


def plot_history(history: History, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Writes ``accuracy.png`` and ``loss.png`` (train, central test, federated eval per round)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    for metric in ("accuracy", "loss"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for prefix, label in (("train", "train (clients)"), ("test", "central test"), ("fed_eval", "federated eval")):
            pts = [(r["round"], r[f"{prefix}_{metric}"]) for r in history.rounds if r.get(f"{prefix}_{metric}") is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.set_ylabel(metric)
        title = history.config.get("algorithm", "")
        ax.set_title(f"{title} {metric} per round".strip())
        ax.grid(alpha=0.3)
        ax.legend()
        written.append(save_figure(fig, Path(out_dir) / f"{metric}.png"))
    return written


def default_latency(num_examples: int, speed: float) -> float:
    """Simulated seconds a client needs: its examples over its speed (examples per second)."""
    return num_examples / speed


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        word = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {word}. Received: {name}={value!r}")
    return int(value)


def _check_rate(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1). Received: {name}={value!r}")
    return float(value)


class Simulation:
    """A federated learning simulation on tensorflow-federated.

    Args:
        model_fn: no-argument callable returning an uncompiled Keras model whose output is logits
            (or probabilities, when its last layer is a softmax) over integer classes.
        clients: the training clients, a ``tff.simulation.datasets.ClientData`` whose examples
            are ``OrderedDict(x=..., y=...)`` (as :func:`~tensorfleet.federated.clients.partition` makes).
        algorithm: a name in :data:`~tensorfleet.federated.algorithms.ALGORITHMS`.
        rounds: rounds to run in total.
        clients_per_round: clients sampled per round (at most the number of training clients).
        seed: seeds client sampling, dropout, latencies and local shuffling.
        batch_size: local batch size.
        local_epochs: local passes over a client's data per round.
        client_optimizer, client_learning_rate, server_optimizer, server_learning_rate: override
            the algorithm's defaults.
        algorithm_options: the algorithm's hyperparameters (``{"mu": 0.1}`` for ``fedprox``).
        aggregator: a name in :data:`~tensorfleet.federated.aggregators.AGGREGATORS`, or a
            ``tff.aggregators`` factory, or None for the algorithm's mean.
        aggregator_options: options of a named aggregator (``{"noise_multiplier": 1.0}``).
        dp_delta: the delta for the epsilon reported with a DP aggregator.
        dropout: probability that a sampled client drops out of a round.
        straggler_deadline: simulated seconds; a client whose latency exceeds it is left out.
        client_speed: median simulated client speed in examples per second (latencies are
            log-normal around it, fixed per client by the seed).
        test_data: ``(x, y)`` central test set, evaluated every ``eval_every`` rounds.
        eval_clients: held-out clients for federated evaluation: a ``ClientData``, or an int to
            hold out that many of ``clients`` (the last ids).
        eval_every: evaluation period in rounds.
        out_dir: where metrics, plots, TensorBoard logs and checkpoints go (None: nowhere).
        checkpoint_every: checkpoint period in rounds (0: none; needs ``out_dir``).
        resume: continue from a checkpoint in ``out_dir`` when there is one.
        progress: show a tqdm progress bar.
        tensorboard: also write TensorBoard summaries into ``out_dir/tensorboard``.
        backend: ``tff`` runs every round on TFF's runtime; ``compiled`` runs the same
            FedAvg-family arithmetic as one compiled TensorFlow function (fedavg, fedavgm,
            fedadam, fedyogi, fedadagrad with the mean aggregator and ``partition()`` data; the
            initial model still comes from TFF). Both give the same model.
        workers: ``host:port`` of running TFF workers (``tensorfleet federated worker``); each
            round's clients are split across them (:mod:`~tensorfleet.federated.backends.remote`).
            None: one worker this process owns.

    Example:
        >>> import tensorfleet as tfl
        >>> split = tfl.models.datasets.load_digits(flat=True)
        >>> clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=10, scheme="iid")
        >>> sim = Simulation(lambda: tfl.models.build("digits_mlp"), clients, "fedprox",
        ...                  algorithm_options={"mu": 0.1}, rounds=2, clients_per_round=2, progress=False)
        >>> history = sim.run()
        >>> history.column("clients"), history.config["algorithm_options"]
        ([2, 2], {'mu': 0.1})
    """

    def __init__(
        self,
        model_fn: Callable[[], Any],
        clients: Any,
        algorithm: str = "fedavg",
        *,
        rounds: int = 10,
        clients_per_round: int = 10,
        seed: int = 0,
        batch_size: int = 20,
        local_epochs: int = 1,
        client_optimizer: str | None = None,
        client_learning_rate: float | None = None,
        server_optimizer: str | None = None,
        server_learning_rate: float | None = None,
        algorithm_options: dict[str, Any] | None = None,
        aggregator: Any = None,
        aggregator_options: dict[str, Any] | None = None,
        dp_delta: float = 1e-5,
        dropout: float = 0.0,
        straggler_deadline: float | None = None,
        client_speed: float = 100.0,
        test_data: tuple[Any, Any] | None = None,
        eval_clients: Any = None,
        eval_every: int = 1,
        out_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 0,
        resume: bool = True,
        progress: bool = True,
        tensorboard: bool = True,
        workers: Sequence[str] | str | None = None,
        backend: str | Backend = Backend.TFF,
    ) -> None:
        from tensorfleet.federated import aggregators, algorithms

        if not callable(model_fn):
            raise TypeError(f"model_fn must be a no-argument callable returning a Keras model. Received: {model_fn!r}")
        self.model_fn = model_fn
        if not hasattr(clients, "client_ids") or not hasattr(clients, "create_tf_dataset_for_client"):
            raise TypeError("clients must be a tff.simulation.datasets.ClientData (see tensorfleet.federated.clients.partition). "
                            f"Received: {type(clients).__name__}")
        self.rounds = _check_int("rounds", rounds, 1)
        self.clients_per_round = _check_int("clients_per_round", clients_per_round, 1)
        self.seed = _check_int("seed", seed, 0)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.local_epochs = _check_int("local_epochs", local_epochs, 1)
        self.eval_every = _check_int("eval_every", eval_every, 1)
        self.checkpoint_every = _check_int("checkpoint_every", checkpoint_every, 0)
        self.dropout = _check_rate("dropout", dropout)
        if straggler_deadline is not None and (not isinstance(straggler_deadline, (int, float))
                                               or isinstance(straggler_deadline, bool) or straggler_deadline <= 0):
            raise ValueError(f"straggler_deadline must be a positive number of seconds or None. "
                             f"Received: straggler_deadline={straggler_deadline!r}")
        self.straggler_deadline = None if straggler_deadline is None else float(straggler_deadline)
        if not isinstance(client_speed, (int, float)) or client_speed <= 0:
            raise ValueError(f"client_speed must be positive. Received: client_speed={client_speed!r}")
        self.client_speed = float(client_speed)

        all_ids = list(clients.client_ids)
        self.eval_clients: Any = None
        eval_ids: list[str] = []
        if isinstance(eval_clients, (int, np.integer)) and not isinstance(eval_clients, bool):
            held = _check_int("eval_clients", eval_clients, 1)
            if held >= len(all_ids):
                raise ValueError(f"eval_clients must leave at least one training client ({len(all_ids)} clients). "
                                 f"Received: eval_clients={held}")
            eval_ids, all_ids = all_ids[-held:], all_ids[:-held]
            self.eval_clients = clients
        elif eval_clients is not None:
            if not hasattr(eval_clients, "client_ids"):
                raise TypeError(f"eval_clients must be a ClientData or an int. Received: {type(eval_clients).__name__}")
            self.eval_clients = eval_clients
            eval_ids = list(eval_clients.client_ids)
        self.clients = clients
        self.train_ids = all_ids
        self.eval_ids = eval_ids
        if self.clients_per_round > len(self.train_ids):
            raise ValueError(f"clients_per_round must not exceed the number of training clients "
                             f"({len(self.train_ids)}). Received: clients_per_round={clients_per_round}")

        self.algorithm_options = dict(algorithm_options or {})
        self.algorithm, self._client_opt, self._server_opt, self._hyper = algorithms.resolve(
            algorithm, client_optimizer=client_optimizer, client_learning_rate=client_learning_rate,
            server_optimizer=server_optimizer, server_learning_rate=server_learning_rate, **self.algorithm_options)
        self._overrides = dict(client_optimizer=client_optimizer, client_learning_rate=client_learning_rate,
                               server_optimizer=server_optimizer, server_learning_rate=server_learning_rate)
        self.aggregator_options = dict(aggregator_options or {})
        if aggregator is None or isinstance(aggregator, str):
            self.aggregator_name = None if aggregator is None else aggregators.AGGREGATORS.canonical(aggregator)
            if self.aggregator_name is not None:
                allowed = aggregators.aggregator_options(self.aggregator_name)
                for key in self.aggregator_options:
                    if key not in allowed:
                        raise TypeError(f"Aggregator {self.aggregator_name!r} takes no option {key!r} (its options: "
                                        f"{', '.join(allowed) or 'none'}). Received: {key}={self.aggregator_options[key]!r}")
            elif self.aggregator_options:
                raise ValueError(f"aggregator_options need an aggregator name. Received: "
                                 f"aggregator_options={self.aggregator_options}")
            self._aggregator_factory = None
        else:
            self.aggregator_name = type(aggregator).__name__
            self._aggregator_factory = aggregator
        self.dp_delta = float(dp_delta)

        self.test_data = None
        if test_data is not None:
            x_test, y_test = (np.asarray(a) for a in test_data)
            if len(x_test) != len(y_test):
                raise ValueError(f"test_data x and y must have the same length. Received: {len(x_test)} and {len(y_test)}")
            self.test_data = (x_test, y_test)

        self.out_dir = Path(out_dir) if out_dir is not None else None
        if self.checkpoint_every and self.out_dir is None:
            raise ValueError(f"checkpoint_every needs an out_dir. Received: checkpoint_every={checkpoint_every}, out_dir=None")
        self.resume = bool(resume)
        self.progress = bool(progress)
        self.tensorboard = bool(tensorboard)
        self.backend = choice(Backend, "backend", backend)
        if self.backend is Backend.COMPILED:
            from tensorfleet.federated.backends.compiled import SUPPORTED_ALGORITHMS

            if self.algorithm not in SUPPORTED_ALGORITHMS or self.aggregator_name not in (None, "mean") \
                    or not hasattr(clients, "arrays"):
                raise ValueError(f"backend='compiled' runs {', '.join(SUPPORTED_ALGORITHMS)} with the mean aggregator "
                                 f"on partition() client data. Received: algorithm={self.algorithm!r}, "
                                 f"aggregator={self.aggregator_name!r}, clients={type(clients).__name__}")
        self._engine: Any = None
        from tensorfleet.federated.backends.remote import parse_addresses

        self.workers = None if workers is None else [str(a) for a in parse_addresses(workers)]
        if self.workers is not None and self.backend is Backend.COMPILED:
            raise ValueError("workers= runs rounds on TFF workers; backend='compiled' runs them in this process. "
                             f"Received: backend='compiled', workers={self.workers}; drop one of them.")

        rng = np.random.default_rng([self.seed, 2**31 - 1])
        self._speeds = {cid: self.client_speed * float(np.exp(rng.normal(0.0, 0.5))) for cid in self.train_ids}
        self._element_spec = clients.element_type_structure
        self._process: Any = None
        self._eval_process: Any = None
        self._keras_model: Any = None
        self._eval_model: Any = None
        self.runtime: Any = None
        self.state: Any = None
        self.weights: Any = None
        self.history = History(config=self.config())

    # ----------------------------------------------------------------- configuration
    def config(self) -> dict[str, Any]:
        """The configuration as plain data (what a checkpoint must match, plus ``rounds``)."""
        return {
            "algorithm": self.algorithm, "algorithm_options": self._hyper,
            "client_optimizer": None if self._client_opt is None else [self._client_opt.name, self._client_opt.learning_rate,
                                                                       self._client_opt.options],
            "server_optimizer": [self._server_opt.name, self._server_opt.learning_rate, self._server_opt.options],
            "aggregator": self.aggregator_name, "aggregator_options": self.aggregator_options,
            "rounds": self.rounds, "clients_per_round": self.clients_per_round, "seed": self.seed,
            "batch_size": self.batch_size, "local_epochs": self.local_epochs, "dropout": self.dropout,
            "straggler_deadline": self.straggler_deadline, "client_speed": self.client_speed,
            "num_train_clients": len(self.train_ids), "num_eval_clients": len(self.eval_ids),
            "clients": getattr(self.clients, "description", type(self.clients).__name__),
            "backend": self.backend.value,
        }

    def fingerprint(self) -> str:
        """A hash of everything that changes the trajectory (not ``rounds``) plus the data."""
        cfg = {k: v for k, v in self.config().items() if k != "rounds"}
        digest = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
        if hasattr(self.clients, "indices"):
            for cid in self.train_ids:
                digest.update(np.ascontiguousarray(self.clients.indices(cid)).tobytes())
            digest.update(hashlib.sha256(np.ascontiguousarray(self.clients.y).tobytes()).digest())
        else:
            digest.update("\n".join(self.train_ids).encode())
        return digest.hexdigest()[:16]

    # ----------------------------------------------------------------- building
    def _loss_and_metrics(self, model: Any) -> tuple[Any, list[Any]]:
        import tensorflow as tf

        last = model.layers[-1]
        from_logits = getattr(last, "activation", None) is not tf.keras.activations.softmax
        return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits), \
            [tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def _input_spec(self) -> Any:
        import tensorflow as tf

        spec = self._element_spec
        if not isinstance(spec, dict) or set(spec) != {"x", "y"}:
            raise ValueError("Client examples must be OrderedDict(x=..., y=...) (use tensorfleet.federated.clients.partition, "
                             f"or ClientData.preprocess to rename). Received element spec: {spec}")
        return collections.OrderedDict(
            x=tf.TensorSpec([None, *spec["x"].shape], spec["x"].dtype),
            y=tf.TensorSpec([None, *spec["y"].shape], spec["y"].dtype))

    def _check_model(self, model: Any) -> None:
        expected = tuple(self._element_spec["x"].shape)
        got = tuple(model.input_shape[1:]) if not isinstance(model.input_shape, list) else None
        if got is None or len(got) != len(expected) or any(g is not None and g != e for g, e in zip(got, expected)):
            raise ValueError(f"The model's input shape does not match the client data: the model takes "
                             f"{model.input_shape}, the examples have x of shape {expected}. Build the model for "
                             f"inputs of shape {expected}.")

    def tff_model_fn(self) -> Any:
        """The ``model_fn`` TFF needs: the Keras model wrapped with ``from_keras_model``."""
        import tensorflow_federated as tff

        input_spec = self._input_spec()

        def fn() -> Any:
            model = self.model_fn()
            loss, metrics = self._loss_and_metrics(model)
            return tff.learning.models.from_keras_model(model, input_spec=input_spec, loss=loss, metrics=metrics)

        return fn

    def _aggregator(self) -> Any:
        if self._aggregator_factory is not None:
            return self._aggregator_factory
        if self.aggregator_name is None:
            return None
        from tensorfleet.federated.aggregators import build_aggregator

        return build_aggregator(self.aggregator_name, clients_per_round=self.clients_per_round, **self.aggregator_options)

    def build(self) -> Any:
        """Builds (once) and returns the ``tff.learning`` process."""
        if self._process is None:
            from tensorfleet.federated import algorithms
            from tensorfleet.federated.backends import tff as runtime

            if self.workers is None:
                self.runtime = runtime.install_default()
            else:
                from tensorfleet.federated.backends import remote as distributed

                self.runtime = distributed.install_default(self.workers)
            model = self.model_fn()
            if not hasattr(model, "input_shape"):
                raise TypeError(f"model_fn must return a Keras model. Received: {type(model).__name__}")
            self._check_model(model)
            self._keras_model = model
            self._process = algorithms.build_process(
                self.algorithm, self.tff_model_fn(), aggregator=self._aggregator(), **self._overrides, **self._hyper)
            if self.eval_ids:
                import tensorflow_federated as tff

                # Built here, before any eager evaluation model: Keras invalidates models made
                # before TFF traces model_fn in a graph.
                self._eval_process = tff.learning.algorithms.build_fed_eval(self.tff_model_fn())
        return self._process

    # ----------------------------------------------------------------- data
    def client_order(self, cid: str, round_num: int, num_examples: int) -> np.ndarray:
        """The order a client visits its examples in a round: one seeded permutation per local epoch."""
        rng = np.random.default_rng([self.seed, round_num, _stable_hash(cid)])
        return np.concatenate([rng.permutation(num_examples) for _ in range(self.local_epochs)])

    def client_arrays(self, cid: str, round_num: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of a client in training order for round ``round_num`` (local epochs included)."""
        x, y = self.clients.arrays(cid)
        order = self.client_order(cid, round_num, len(y))
        return x[order], y[order]

    def _client_dataset(self, data: Any, cid: str, round_num: int, shuffle: bool = True) -> Any:
        import tensorflow as tf

        if hasattr(data, "arrays"):
            x, y = self.client_arrays(cid, round_num) if shuffle else data.arrays(cid)
            return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(self.batch_size)
        ds = data.create_tf_dataset_for_client(cid)
        if shuffle:
            seed = int(np.random.default_rng([self.seed, round_num, _stable_hash(cid)]).integers(2**31 - 1))
            ds = ds.shuffle(10_000, seed=seed, reshuffle_each_iteration=True).repeat(self.local_epochs)
        return ds.batch(self.batch_size)

    def _num_examples(self, cid: str) -> int:
        if hasattr(self.clients, "indices"):
            return len(self.clients.indices(cid))
        return int(self.clients.create_tf_dataset_for_client(cid).reduce(0, lambda c, _: c + 1))

    def sample(self, round_num: int) -> dict[str, list[str]]:
        """The clients of round ``round_num``: sampled, dropped out, stragglers, participants."""
        rng = np.random.default_rng([self.seed, round_num])
        picked = rng.choice(len(self.train_ids), size=self.clients_per_round, replace=False)
        sampled = [self.train_ids[i] for i in sorted(picked)]
        drop = rng.random(len(sampled)) < self.dropout
        dropped = [c for c, d in zip(sampled, drop) if d]
        alive = [c for c, d in zip(sampled, drop) if not d]
        stragglers: list[str] = []
        if self.straggler_deadline is not None:
            jitter = np.exp(rng.normal(0.0, 0.1, size=len(alive)))
            latency = {c: default_latency(self._num_examples(c) * self.local_epochs, self._speeds[c]) * j
                       for c, j in zip(alive, jitter)}
            stragglers = [c for c in alive if latency[c] > self.straggler_deadline]
        participants = [c for c in alive if c not in stragglers]
        return {"sampled": sampled, "dropped": dropped, "stragglers": stragglers, "participants": participants}

    # ----------------------------------------------------------------- evaluation
    def model_weights(self, state: Any) -> Any:
        """``tff.learning.models.ModelWeights`` of a state (or of the compiled engine)."""
        if self._engine is not None and state is self._engine:
            import tensorflow_federated as tff

            return tff.learning.models.ModelWeights(trainable=self._engine.get_weights(), non_trainable=[])
        return self.build().get_model_weights(state)

    def _make_engine(self, state: Any) -> Any:
        import tensorflow as tf

        from tensorfleet.federated.algorithms import make_optimizer
        from tensorfleet.federated.backends.compiled import CompiledFedAvg

        initial = [np.asarray(w) for w in self.build().get_model_weights(state).trainable]
        model = self._keras_model
        loss, _ = self._loss_and_metrics(model)
        per_example = type(loss)(from_logits=loss.get_config()["from_logits"], reduction=tf.keras.losses.Reduction.NONE)
        max_examples = max(len(self.clients.indices(c)) for c in self.train_ids) * self.local_epochs
        assert self._client_opt is not None
        with tf.init_scope():
            return CompiledFedAvg(model_fn=self.model_fn, loss_fn=per_example,
                                  client_optimizer=make_optimizer(self._client_opt),
                                  server_optimizer=make_optimizer(self._server_opt), initial_weights=initial,
                                  batch_size=self.batch_size, max_examples=max_examples,
                                  clients_per_round=self.clients_per_round)

    def keras_model(self, state: Any) -> Any:
        """A compiled Keras model holding the weights of ``state``."""
        import tensorflow as tf

        self.build()
        if self._eval_model is None:
            # A model made after TFF has traced model_fn in its graphs, so Keras builds it eagerly.
            with tf.init_scope():
                self._eval_model = self.model_fn()
        self.model_weights(state).assign_weights_to(self._eval_model)
        return self._eval_model

    def evaluate_central(self, state: Any) -> dict[str, float]:
        assert self.test_data is not None
        model = self.keras_model(state)
        loss_fn, _ = self._loss_and_metrics(model)
        x, y = self.test_data
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), 512):
            logits = model(x[start:start + 512], training=False)
            total_loss += float(loss_fn(y[start:start + 512], logits)) * len(logits)
            correct += int(np.sum(np.argmax(np.asarray(logits), axis=-1) == y[start:start + 512]))
        return {"test_loss": total_loss / len(x), "test_accuracy": correct / len(x)}

    def evaluate_federated(self, state: Any, round_num: int) -> dict[str, float]:
        self.build()
        ev = self._eval_process
        ev_state = ev.set_model_weights(ev.initialize(), self.model_weights(state))
        data = [self._client_dataset(self.eval_clients, cid, round_num, shuffle=False) for cid in self.eval_ids]
        metrics = ev.next(ev_state, data).metrics["client_work"]["eval"]["current_round_metrics"]
        return {"fed_eval_loss": float(metrics["loss"]), "fed_eval_accuracy": float(metrics["accuracy"])}

    # ----------------------------------------------------------------- checkpoints
    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / _CHECKPOINT

    def save_checkpoint(self, state: Any, round_num: int) -> Path:
        """Writes the full algorithm state after ``round_num`` (atomically)."""
        import tensorflow as tf

        assert self.checkpoint_path is not None
        leaves = state.state_leaves() if state is self._engine and state is not None else tf.nest.flatten(state)
        buffer = io.BytesIO()
        arrays = {f"leaf_{i:05d}": np.asarray(v) for i, v in enumerate(leaves)}
        meta = json.dumps({"round": round_num, "fingerprint": self.fingerprint(), "config": self.config(),
                           "history": self.history.rounds})
        np.savez(buffer, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **arrays)
        return write_bytes(self.checkpoint_path, buffer.getvalue())

    def load_checkpoint(self, template: Any) -> tuple[Any, int, list[dict[str, Any]]] | None:
        """``(state, round, history)`` from ``out_dir``'s checkpoint, or None when there is none."""
        import tensorflow as tf

        path = self.checkpoint_path
        if path is None or not path.is_file():
            return None
        with np.load(path) as data:
            meta = json.loads(bytes(data["__meta__"]).decode())
            if meta["fingerprint"] != self.fingerprint():
                theirs, ours = meta["config"], self.config()
                diff = sorted(k for k in set(theirs) | set(ours) if k != "rounds" and theirs.get(k) != ours.get(k))
                detail = ", ".join(f"{k}: checkpoint {theirs.get(k)!r} vs now {ours.get(k)!r}" for k in diff) or "client data"
                raise CheckpointMismatchError(
                    f"The checkpoint in {path.parent} comes from a different configuration ({detail}). Use another "
                    f"out_dir, or resume=False to start over.")
            leaves = [data[f"leaf_{i:05d}"] for i in range(len(data.files) - 1)]
        if template is self._engine and template is not None:
            template.load_leaves(leaves)
            return template, int(meta["round"]), list(meta["history"])
        template_leaves = tf.nest.flatten(template)
        shapes = [np.shape(v) for v in leaves]
        expected = [np.shape(v) for v in template_leaves]
        if shapes != expected:
            raise CheckpointMismatchError(f"The checkpoint in {path.parent} holds tensors of shapes {shapes[:6]}...; "
                                          f"this configuration's model state has {expected[:6]}... (another model?).")
        return tf.nest.pack_sequence_as(template, leaves), int(meta["round"]), list(meta["history"])

    # ----------------------------------------------------------------- the loop
    def _epsilon(self, rounds_done: int) -> float | None:
        if self.aggregator_name not in ("dp_fixed", "dp_adaptive"):
            return None
        from tensorfleet.federated.aggregators.dp import epsilon

        nm = float(self.aggregator_options.get("noise_multiplier", 1.0))
        return epsilon(noise_multiplier=nm, sampling_rate=self.clients_per_round / len(self.train_ids),
                       rounds=rounds_done, delta=self.dp_delta)

    def _upload_bytes(self) -> int | None:
        if self.aggregator_name != "compression":
            return None
        from tensorfleet.federated.aggregators.aggregate import compressed_bytes

        sizes = [int(np.prod(w.shape)) for w in self._keras_model.trainable_weights]
        return compressed_bytes(sizes, bits=int(self.aggregator_options.get("bits", 8)),
                                sparsity=float(self.aggregator_options.get("sparsity", 0.0)))

    def run(self, *, stop_worker: bool = True) -> History:
        """Runs the remaining rounds and returns the :class:`History`.

        The TFF worker is stopped when the run ends (also on error), unless ``stop_worker`` is
        False.
        """
        try:
            return self._run()
        finally:
            if stop_worker and self.runtime is not None:
                self.runtime.stop()

    def _run(self) -> History:
        from tqdm.auto import tqdm

        process = self.build()
        worker = getattr(self.runtime, "worker", None)
        if worker is not None and hasattr(worker, "start"):
            # Started from this thread: PR_SET_PDEATHSIG ties the worker to the thread that
            # forks it, and TFF would otherwise start it lazily from its own event-loop thread.
            worker.start()
        state = process.initialize()
        if self.backend is Backend.COMPILED:
            self._engine = state = self._make_engine(state)
            if self.runtime is not None and not self.eval_ids:
                self.runtime.stop()  # rounds run in this process; the worker is needed again only for eval
        start_round = 0
        self.history = History(config=self.config())
        if self.resume:
            loaded = self.load_checkpoint(state)
            if loaded is not None:
                state, start_round, rounds = loaded
                self.history.rounds = [r for r in rounds if r["round"] <= start_round]
        self.state = state
        writer = self._tensorboard_writer()
        full_bytes = None
        if self._keras_model is not None:
            full_bytes = 4 * sum(int(np.prod(w.shape)) for w in self._keras_model.trainable_weights)
        upload = self._upload_bytes()
        bar = tqdm(total=self.rounds, initial=start_round, desc=f"{self.algorithm}", unit="round",
                   disable=not self.progress, dynamic_ncols=True)
        try:
            for round_num in range(start_round + 1, self.rounds + 1):
                t0 = time.perf_counter()
                who = self.sample(round_num)
                record: dict[str, Any] = {"round": round_num, "clients": len(who["sampled"]),
                                          "participants": len(who["participants"]), "dropped": len(who["dropped"]),
                                          "stragglers": len(who["stragglers"])}
                if who["participants"] and self._engine is not None:
                    record.update(self._engine.next([self.client_arrays(c, round_num) for c in who["participants"]]))
                elif who["participants"]:
                    data = [self._client_dataset(self.clients, cid, round_num) for cid in who["participants"]]
                    out = process.next(state, data)
                    state = out.state
                    train = out.metrics["client_work"]["train"]
                    record["train_loss"] = float(train["loss"])
                    record["train_accuracy"] = float(train["accuracy"])
                    record["num_examples"] = int(train["num_examples"])
                    agg = out.metrics.get("aggregator")
                    if isinstance(agg, dict):
                        for key in ("non_finite", "clipping_norm"):
                            if key in agg:
                                record[f"aggregator_{key}"] = float(np.asarray(agg[key]))
                per_client = upload if upload is not None else full_bytes
                if per_client is not None:
                    record["upload_bytes"] = int(per_client) * len(who["participants"])
                eps = self._epsilon(round_num)
                if eps is not None:
                    record["epsilon"] = eps
                if round_num % self.eval_every == 0 or round_num == self.rounds:
                    if self.test_data is not None:
                        record.update(self.evaluate_central(state))
                    if self.eval_ids:
                        record.update(self.evaluate_federated(state, round_num))
                record["seconds"] = time.perf_counter() - t0
                self.history.rounds.append(record)
                self.state = state
                self._log(writer, record)
                if self.out_dir is not None:
                    self.history.save(self.out_dir)
                if self.checkpoint_every and (round_num % self.checkpoint_every == 0 or round_num == self.rounds):
                    self.save_checkpoint(state, round_num)
                bar.set_postfix({k: f"{record[k]:.3f}" for k in ("train_loss", "train_accuracy", "test_accuracy")
                                 if k in record}, refresh=False)
                bar.update(1)
        finally:
            bar.close()
            if writer is not None:
                writer.close()
        self.weights = self.model_weights(state)
        if self.out_dir is not None:
            self.history.save(self.out_dir)
            plot_history(self.history, self.out_dir)
        return self.history

    def _tensorboard_writer(self) -> Any:
        if self.out_dir is None or not self.tensorboard:
            return None
        import tensorflow as tf

        # TensorBoard appends to event files itself; they are logs, not results, so not atomic.
        return tf.summary.create_file_writer(str(self.out_dir / "tensorboard"))

    def _log(self, writer: Any, record: dict[str, Any]) -> None:
        if writer is None:
            return
        import tensorflow as tf

        with writer.as_default(step=record["round"]):
            for key, value in record.items():
                if key != "round" and isinstance(value, (int, float)) and math.isfinite(value):
                    tf.summary.scalar(key, value)
        writer.flush()

    def final_weights(self) -> list[np.ndarray]:
        """The trainable weights of the current global model (after :meth:`run`)."""
        if getattr(self, "weights", None) is None:
            raise RuntimeError("final_weights() needs a finished run(); call run() first.")
        return [np.asarray(w) for w in self.weights.trainable]


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")
