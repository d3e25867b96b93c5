"""The federated round loop: :class:`Simulation`.

A :class:`Simulation` trains a plain Keras model (``model_fn`` returns an uncompiled
``tf.keras.Model``) and runs rounds where its
:class:`~tensorfleet.federated.config.SimulationConfig` says (:mod:`tensorfleet.federated.backends`:
by default ``auto``, the compiled backend, which needs no tensorflow-federated and builds neither
TFF process nor worker; on the tff track, for what the compiled backend refuses, TFF's runtime on a
worker it owns, where the model is wrapped with ``tff.learning.models.from_keras_model`` and the
algorithm's ``tff.learning`` process is built; :meth:`Simulation.header` names the backend that
runs):

* seeded client sampling (round ``r`` draws from ``default_rng([seed, r])``, so a resumed run
  samples as an uninterrupted one), a per-round dropout rate and a straggler deadline on
  simulated client latencies: clients that do not report are left out of that round's aggregate;
* evaluation on central test data and federated evaluation on held-out clients every
  ``eval_every`` rounds;
* metrics per round in ``metrics.json`` / ``metrics.csv`` (:mod:`~tensorfleet.federated.history`)
  and TensorBoard, PNG plots of accuracy and loss, a tqdm progress bar with the current metrics;
* a checkpoint every ``checkpoint_every`` rounds (atomic); a run started again with the same
  arguments and ``out_dir`` resumes from its last checkpoint, and a checkpoint of another
  configuration is refused (:mod:`~tensorfleet.federated.checkpoint`).

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

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tensorfleet.federated import checkpoint, records, tff_model
from tensorfleet.federated.backends import Backend, BackendChoice
from tensorfleet.federated.backends.compiled.evaluate import ModelWeights
from tensorfleet.federated.backends.compiled.layout import NonTrainable
from tensorfleet.federated.backends.compiled.local import GLOBAL_BN
from tensorfleet.federated.config import SimulationConfig
from tensorfleet.federated.history import History, plot_history
from tensorfleet.federated.sampling import ClientSampler, split_clients
from tensorfleet.validation import choice

__all__ = ["ModelWeights", "Simulation", "settle_backend"]


class Simulation:
    """A federated learning simulation (compiled in this process, or on tensorflow-federated).

    Args:
        model_fn: no-argument callable returning an uncompiled Keras model whose output is logits
            (or probabilities, when its last layer is a softmax) over integer classes.
        clients: the training clients: made by :func:`~tensorfleet.federated.clients.partition`
            (or any :class:`~tensorfleet.federated.clients.base.ClientData`), or TFF's own ClientData
            (such as ``tff.simulation.datasets.emnist.get_synthetic()``), batched or not; its model input
            and label are found by name or given with ``x_key``/``y_key``
            (:func:`~tensorfleet.federated.clients.xy.xy_clients`).
        algorithm: a name in :data:`~tensorfleet.federated.algorithms.ALGORITHMS`.
        test_data: ``(x, y)`` central test set, evaluated every ``eval_every`` rounds.
        eval_clients: held-out clients for federated evaluation: a ``ClientData``, or an int to
            hold out that many of ``clients`` (the last ids).
        x_key, y_key: the names of the model input and the label in the examples of ``clients``
            (and of ``eval_clients``), when their names do not tell (``pixels`` and ``label``
            do; the error lists the names found).
        **options: the fields of :class:`~tensorfleet.federated.config.SimulationConfig`
            (``rounds``, ``clients_per_round``, ``seed``, ``dropout``, ``out_dir``, ``backend``,
            ``workers``, ...), checked there; the checked object is :attr:`config`.

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

    def __init__(self, model_fn: Callable[[], Any], clients: Any, algorithm: str = "fedavg", *,
                 test_data: tuple[Any, Any] | None = None, eval_clients: Any = None, x_key: str | None = None,
                 y_key: str | None = None, **options: Any) -> None:
        from tensorfleet.federated.clients.base import as_client_data, with_arrays
        from tensorfleet.federated.clients.xy import xy_clients

        if not callable(model_fn):
            raise TypeError(f"model_fn must be a no-argument callable returning a Keras model. Received: {model_fn!r}")
        if hasattr(model_fn, "get_weights") and hasattr(model_fn, "layers"):  # a built model (either Keras) is callable
            raise TypeError("model_fn must be a no-argument callable that builds a new Keras model (the run builds "
                            "its own copies from it), not a model. Received: a model of type "
                            f"{type(model_fn).__name__}; pass a function, such as lambda: keras.Sequential([...])")
        as_client_data(clients)  # a TypeError naming what clients may be
        self.model_fn = model_fn
        self.config = SimulationConfig.from_options(algorithm, **options)
        # What was asked (the config holds what runs: 'auto' is decided there or when built).
        self.requested_backend = choice(Backend, "backend", options.get("backend", SimulationConfig.backend))
        clients = self.clients = with_arrays(xy_clients(clients, x_key=x_key, y_key=y_key))
        if hasattr(eval_clients, "client_ids"):
            eval_clients = with_arrays(xy_clients(eval_clients, x_key=x_key, y_key=y_key))
        self.train_ids, self.eval_ids, self.eval_clients = split_clients(clients, eval_clients)
        if self.config.clients_per_round > len(self.train_ids):
            raise ValueError(f"clients_per_round must not exceed the number of training clients "
                             f"({len(self.train_ids)}). Received: clients_per_round={self.config.clients_per_round}")
        self.test_data = _check_test_data(test_data)
        self.sampler = ClientSampler(clients, self.train_ids, self.config)
        # Where the rounds run, beside the user's config (which is never rewritten): the data checked now
        # ('compiled' refuses what it cannot run); 'auto' is decided once, when the model is built.
        self.where = settle_backend(self.config, self.clients)
        self._element_spec = clients.element_type_structure
        self._keras_model: Any = None
        self._eval_model: Any = None
        self._central_step: Any = None  # the central evaluation's batch, traced once (evaluate_central)
        self.rounds: Any = None  # the RoundBackend, made when the model is built
        self.state: Any = None  # the backend holding the algorithm's state, once started
        self.weights: Any = None
        self.history = History(config=self._history_config())
        self.round_listeners: list[Callable[[dict[str, Any]], None]] = []  # called with each round's record

    # ----------------------------------------------------------------- configuration
    def as_dict(self) -> dict[str, Any]:
        """The configuration as plain data (what a checkpoint must match, plus ``rounds``) with the clients."""
        return {**self.config.trajectory(), "backend": self.backend.value, "num_train_clients": len(self.train_ids),
                "num_eval_clients": len(self.eval_ids),
                "clients": getattr(self.clients, "description", type(self.clients).__name__)}

    def _history_config(self) -> dict[str, Any]:
        """:meth:`as_dict` plus what the records need to be read (the delta of a DP run's epsilon)."""
        dp = records.is_dp(self.config)
        from tensorfleet.federated.backends.threads import thread_pools

        intra_op, inter_op = thread_pools()
        return {**self.as_dict(), "backend_requested": self.requested_backend.value,
                "tf_threads": {"intra_op": intra_op, "inter_op": inter_op},
                **({"dp_delta": self.config.dp_delta} if dp else {}),
                **({"global_bn": GLOBAL_BN} if self.config.non_trainable == NonTrainable.PER_CLIENT.value else {})}

    def header(self) -> str:
        """What runs, for the progress bar: ``fedavg on compiled (chosen by auto)``."""
        chosen = " (chosen by auto)" if self.requested_backend is Backend.AUTO else ""
        return f"{self.config.algorithm} on {self.backend.value}{chosen}"

    def fingerprint(self) -> str:
        """A hash of everything that changes the trajectory (not ``rounds``) plus the data."""
        return checkpoint.fingerprint(self.as_dict(), self.train_ids, self.clients)

    # ----------------------------------------------------------------- building
    @property
    def backend(self) -> Backend:
        """The backend that runs the rounds: ``tff`` or ``compiled`` (``auto`` until the model is built)."""
        return self.where.backend

    def tff_model_fn(self) -> Any:
        """The ``model_fn`` TFF needs: the Keras model wrapped with ``from_keras_model``."""
        return tff_model.tff_model_fn(self.model_fn, self._element_spec)

    @property
    def runtime(self) -> Any:
        """What the backend started (TFF's worker or remote workers), or None."""
        return None if self.rounds is None else self.rounds.runtime

    def build(self) -> Any:
        """Builds (once) the model and the backend that runs the rounds
        (:data:`~tensorfleet.federated.backends.rounds.ROUND_BACKENDS`); returns its TFF learning process
        (None where no TFF process is built: the compiled backend needs no process, worker or tracing)."""
        if self._keras_model is None:
            from tensorfleet.compat.keras import keras_of, seeded

            # The seed makes the whole run: the model's initial weights, each lane's copy and its Dropout draws
            # (the process's random state is as it was afterwards).
            with seeded(self.config.seed):
                model = self.model_fn()
            keras_of(model, "tfl.federated.Simulation (the model of model_fn)")
            tff_model.check_model(model, self._element_spec)
            self.where = settle_backend(self.config, self.clients, model)  # 'auto' decided, once
            self._keras_model = model
        if self.rounds is None:
            from tensorfleet.federated.backends.rounds import ROUND_BACKENDS

            self.rounds = ROUND_BACKENDS[self.backend](self)
            self.rounds.build()
        return self.rounds.process

    def sample(self, round_num: int) -> dict[str, list[str]]:
        """The clients of round ``round_num``: sampled, dropped out, stragglers, participants."""
        return self.sampler.sample(round_num)

    # ----------------------------------------------------------------- evaluation
    def model_weights(self, state: Any = None) -> Any:
        """The server model's weights (``trainable``, ``non_trainable``, ``assign_weights_to(model)``);
        ``state``: the backend that holds them (:attr:`state`; default: this simulation's)."""
        self.build()
        return (self.rounds if state is None else state).model_weights()

    def keras_model(self, state: Any = None) -> Any:
        """A Keras model holding the server's weights (or those of a TFF ``state`` given)."""
        import tensorflow as tf

        self.build()
        if self._eval_model is None:
            # A model made after TFF has traced model_fn in its graphs, so Keras builds it eagerly.
            with tf.init_scope():
                self._eval_model = self.model_fn()
        self.rounds.assign_weights_to(self._eval_model, None if state is self.rounds else state)
        return self._eval_model

    def evaluate_central(self, state: Any = None) -> dict[str, float]:
        """The server model on the central ``test_data`` (under FedBN its BatchNormalization layers are the
        participants' mean: the history's ``config["global_bn"]`` says so)."""
        assert self.test_data is not None
        return self._evaluate(self.keras_model(state), *self.test_data)

    def evaluate_clients(self, data: dict[str, tuple[Any, Any]]) -> dict[str, dict[str, Any]]:
        """Each client's model on its own ``(x, y)`` (``data``: client id -> its test examples): under
        FedBN (``non_trainable="per_client"``) the server's weights with the client's own BatchNormalization
        layers, as FedBN's paper evaluates; ``own_bn`` False where the client has none (never sampled, or no
        FedBN: the server model's). Returns client id -> ``{"test_loss", "test_accuracy", "own_bn"}``."""
        self.build()
        model = self.keras_model()
        out = {}
        for client_id, (x, y) in data.items():
            weights, own = self.rounds.client_weights(str(client_id))
            weights.assign_weights_to(model)
            x, y = _check_xy(x, y)
            out[client_id] = {**self._evaluate(model, x, y), "own_bn": own}
        self.rounds.assign_weights_to(model)
        return out

    def _evaluate(self, model: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        if self._central_step is None:
            self._central_step = tff_model.central_step(model, x, y)
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), 512):
            loss_sum, hits = self._central_step(x[start:start + 512], y[start:start + 512])
            total_loss += float(loss_sum)
            correct += int(hits)
        return {"test_loss": total_loss / len(x), "test_accuracy": correct / len(x)}

    def evaluate_federated(self, state: Any = None, round_num: int = 0) -> dict[str, float]:
        self.build()
        data = [self.sampler.client_dataset(self.eval_clients, cid, round_num, shuffle=False) for cid in self.eval_ids]
        return self.rounds.evaluate_federated(self.keras_model(state), data)

    # ----------------------------------------------------------------- checkpoints
    def save_checkpoint(self, state: Any, round_num: int) -> Any:
        """Writes the full algorithm state (of the backend ``state``) after ``round_num`` into ``out_dir``
        (atomically)."""
        assert self.config.out_dir is not None
        return checkpoint.save_checkpoint(self.config.out_dir, state.state_leaves(), round_num=round_num,
                                          fingerprint=self.fingerprint(), config=self.as_dict(),
                                          history=self.history.rounds,
                                          model=checkpoint.model_layers(self._keras_model))

    def load_checkpoint(self, template: Any) -> tuple[Any, int, list[dict[str, Any]]] | None:
        """``(state, round, history)`` from ``out_dir``'s checkpoint (loaded into the backend
        ``template``), or None when there is none."""
        if self.config.out_dir is None:
            return None
        found = checkpoint.read_checkpoint(self.config.out_dir, self.fingerprint(), self.as_dict(),
                                           checkpoint.model_layers(self._keras_model))
        if found is None:
            return None
        leaves, round_num, rounds = found
        checkpoint.check_shapes(self.config.out_dir, leaves, template.state_leaves(), template.ragged_leaves)
        template.load_leaves(leaves)
        return template, round_num, rounds

    # ----------------------------------------------------------------- the loop
    def run(self, *, stop_worker: bool = True) -> History:
        """Runs the remaining rounds and returns the :class:`~tensorfleet.federated.history.History`.

        The TFF worker is stopped when the run ends (also on error), unless ``stop_worker`` is
        False.
        """
        from tensorfleet.compat.keras import seeded

        try:
            with seeded(self.config.seed):  # lanes, traced rounds and their Dropout follow the seed too
                return self._run()
        finally:
            if stop_worker and self.rounds is not None:
                self.rounds.stop()

    def _start(self) -> tuple[Any, int]:
        """``(backend, rounds done)``: the backend built, its state initialized or resumed."""
        self.build()
        # Data made on request (lazy clients, TFF's) is not read ahead: the engine grows to the
        # largest client a round brings.
        max_examples = max(len(self.clients.indices(c)) for c in self.train_ids) \
            if hasattr(self.clients, "indices") else 1
        state = self.rounds
        state.initialize(self._keras_model, max_examples)
        start_round = 0
        self.history = History(config=self._history_config())
        if self.config.resume is not False:
            loaded = self.load_checkpoint(state)
            if loaded is None and self.config.resume:
                raise ValueError(f"Nothing to resume in out_dir={str(self.config.out_dir)!r}: it holds no checkpoint. "
                                 "Received: resume=True (--resume); leave resume unset (no --resume) to begin a run.")
            if loaded is not None:
                state, start_round, rounds = loaded
                if start_round > self.config.rounds:
                    assert self.config.out_dir is not None  # the checkpoint was read from it
                    raise checkpoint.CheckpointAheadError(self.config.out_dir, start_round, self.config.rounds)
                self.history.rounds = [r for r in rounds if r["round"] <= start_round]
        self.state = state
        return state, start_round

    def _round(self, state: Any, round_num: int) -> dict[str, Any]:
        """One round: sampling, training, the round's bytes and epsilon, evaluation when due."""
        t0 = time.perf_counter()
        who = self.sample(round_num)
        records.check_participants(self.config, who, round_num)
        record: dict[str, Any] = {"round": round_num, "clients": len(who["sampled"]),
                                  "participants": len(who["participants"]), "dropped": len(who["dropped"]),
                                  "stragglers": len(who["stragglers"])}
        if who["participants"]:
            record.update(state.run_round(round_num, who["participants"], who["work"]))
        if self._keras_model is not None:
            sizes = records.sent_sizes(self.config, self._keras_model)
            record["upload_bytes"] = records.upload_bytes(self.config, sizes) * len(who["participants"])
        eps = records.round_epsilon(self.config, num_clients=len(self.train_ids), rounds_done=round_num)
        if eps is not None:
            record["epsilon"] = eps
        if round_num % self.config.eval_every == 0 or round_num == self.config.rounds:
            if self.test_data is not None:
                record.update(self.evaluate_central(state))
            if self.eval_ids:
                record.update(self.evaluate_federated(state, round_num))
        record["seconds"] = time.perf_counter() - t0
        return record

    def _run(self) -> History:
        from tqdm.auto import tqdm

        state, start_round = self._start()
        out_dir, every = self.config.out_dir, self.config.checkpoint_every
        writer = self._tensorboard_writer()
        bar = tqdm(total=self.config.rounds, initial=start_round, desc=self.header(), unit="round",
                   disable=not self.config.progress, dynamic_ncols=True)
        try:
            for round_num in range(start_round + 1, self.config.rounds + 1):
                record = self._round(state, round_num)
                self.history.rounds.append(record)
                self.state = state
                self._log(writer, record)
                for listener in list(self.round_listeners):
                    listener(record)
                if out_dir is not None:
                    self.history.save(out_dir)
                if every and (round_num % every == 0 or round_num == self.config.rounds):
                    self.save_checkpoint(state, round_num)
                bar.set_postfix({k: f"{record[k]:.3f}" for k in ("train_loss", "train_accuracy", "test_accuracy")
                                 if k in record}, refresh=False)
                bar.update(1)
        finally:
            bar.close()
            if writer is not None:
                writer.close()
        self.weights = state.model_weights()
        if out_dir is not None:
            self.history.save(out_dir)
            plot_history(self.history, out_dir)
        return self.history

    def _tensorboard_writer(self) -> Any:
        if self.config.out_dir is None or not self.config.tensorboard:
            return None
        import tensorflow as tf

        # TensorBoard appends to event files itself; they are logs, not results, so not atomic.
        return tf.summary.create_file_writer(str(Path(self.config.out_dir) / "tensorboard"))

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


def settle_backend(config: SimulationConfig, clients: Any, model: Any = None) -> BackendChoice:
    """Where ``config``'s rounds run for ``clients`` (and ``model``, once built), without changing ``config``:
    ``compiled`` checked against them (ValueError for what it cannot run as TFF does); ``auto`` decided
    (``auto`` again while ``model`` is None and the data allow ``compiled``), resuming a checkpoint on the
    backend that wrote it, as the state is that backend's."""
    where = config.where.resolve(clients, model)
    if model is not None and where.compiled and config.backend is Backend.AUTO and config.resume is not False \
            and (checkpoint.checkpoint_config(config.out_dir) or {}).get("backend") == Backend.TFF.value:
        return BackendChoice(Backend.TFF)
    return where


def _check_test_data(test_data: tuple[Any, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    return None if test_data is None else _check_xy(*test_data)


def _check_xy(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    x_test, y_test = np.asarray(x), np.asarray(y)
    if len(x_test) != len(y_test):
        raise ValueError(f"test_data x and y must have the same length. Received: {len(x_test)} and {len(y_test)}")
    return x_test, y_test

