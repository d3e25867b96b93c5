"""The one protocol a :class:`~tensorfleet.federated.Simulation` talks to, :class:`RoundBackend`, and
its two implementations, looked up by :class:`~tensorfleet.federated.backends.Backend` in
:data:`ROUND_BACKENDS`: :class:`CompiledRounds` (the compiled engine, in this process) and
:class:`TffRounds` (TFF's learning process on its runtime).

A backend holds the algorithm's state (the server model, optimizer state, the aggregator's state)
between rounds; the simulation samples the clients, keeps the history, evaluates centrally and
writes checkpoints through it, and never asks which backend runs.

Example:
    >>> sorted(b.value for b in ROUND_BACKENDS)
    ['compiled', 'tff']
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from tensorfleet.federated.backends import Backend
from tensorfleet.federated.backends.compiled.evaluate import ModelWeights

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tensorfleet.federated.backends.compiled import CompiledFedAvg

__all__ = ["CompiledRounds", "ROUND_BACKENDS", "RoundBackend", "TffRounds", "build_engine"]


class RoundBackend(Protocol):
    """What runs a simulation's rounds.

    Attributes:
        process: TFF's learning process (None where no TFF process is built).
        runtime: what the backend started and must stop (TFF's worker, remote workers), or None.
    """

    process: Any
    runtime: Any

    def build(self) -> Any:
        """Builds what runs before any state is made (TFF's processes and runtime); returns the process."""

    def initialize(self, model: Any, max_examples: int) -> None:
        """Makes the initial state (``model`` is ``model_fn()``'s, made and checked; ``max_examples`` the
        largest training client's examples, or 1 when the data are made on request)."""

    def run_round(self, round_num: int, participants: Sequence[str], work: dict[str, int]) -> dict[str, Any]:
        """Trains round ``round_num`` on ``participants`` (``work``: the examples a straggler's partial
        work reaches); returns the round's training metrics."""

    def model_weights(self) -> ModelWeights:
        """The server model's weights (trainable and non-trainable)."""

    def client_weights(self, client_id: str) -> tuple[ModelWeights, bool]:
        """``(weights, own)``: the weights client ``client_id`` evaluates with; ``own``: with layers of
        its own (FedBN's BatchNormalization), else the server model's."""

    def assign_weights_to(self, model: Any, state: Any = None) -> None:
        """Sets ``model``'s weights to the server's (or to those of a TFF ``state`` given)."""

    def state_leaves(self) -> list[np.ndarray]:
        """The full algorithm state as arrays, for a checkpoint."""

    def load_leaves(self, leaves: Sequence[np.ndarray]) -> None:
        """Restores a checkpoint's arrays (same count and shapes as :meth:`state_leaves`)."""

    @property
    def ragged_leaves(self) -> tuple[int, ...]:
        """The positions of :meth:`state_leaves` whose first axis grows with the clients sampled."""

    def evaluate_federated(self, model: Any, datasets: Sequence[Any]) -> dict[str, float]:
        """Federated evaluation of the server model on the evaluation clients' batched datasets."""

    def stop(self) -> None:
        """Stops what the backend started (nothing, for the compiled one)."""


class CompiledRounds:
    """The compiled backend (:mod:`~tensorfleet.federated.backends.compiled`): no TFF process, worker or tracing."""

    process = None
    runtime = None

    def __init__(self, simulation: Any) -> None:
        self.sim = simulation
        self.engine: Any = None
        self.workers: Any = None  # the TensorFlow workers the lanes run on (workers=), or None

    def build(self) -> Any:
        return None  # the engine is made with the initial state, from the built model

    def initialize(self, model: Any, max_examples: int) -> None:
        if self.sim.config.workers and self.workers is None:
            from tensorfleet.federated.backends.compiled.workers import connect

            self.workers = connect(self.sim.config.workers)
            if self.sim.config.round_timeout is not None:
                self.workers.round_timeout = self.sim.config.round_timeout
        devices = None if self.workers is None else self.workers.devices
        self.engine = build_engine(self.sim.config, self.sim.model_fn, model, max_examples, devices=devices)
        if self.workers is not None:
            self.engine.invoke = self.workers.call

    def run_round(self, round_num: int, participants: Sequence[str], work: dict[str, int]) -> dict[str, Any]:
        import tensorflow as tf

        from tensorfleet.federated.backends.compiled.workers import RoundAbandoned

        sampler = self.sim.sampler
        clients = [sampler.client_arrays(c, round_num, work.get(c)) for c in participants]
        # The state before the round: a call abandoned on a frozen worker may have written part of it.
        before = self.engine.state_leaves() if self.workers is not None and self.workers.round_timeout else None
        while True:
            try:
                return self.engine.next(clients, round_num, client_ids=list(participants))
            except RoundAbandoned as abandoned:
                # Fresh server variables and lane models: the abandoned call, should it end, changes nothing.
                self.engine.rebind(before)
                self.workers.check_left()  # AllWorkersLostError, the state kept as it was before the round
                log.warning("round %d: %s Running the round again on %d worker(s)", round_num, abandoned,
                            len(self.workers.devices))
                self.engine.keep_devices(self.workers.devices, rebuild=True)
            except tf.errors.UnavailableError:
                if before is not None:  # (the state before the round, whatever a failed call wrote)
                    self.engine.load_leaves(before)
                # A worker gone: the server's state changes only after every lane is done, so the round runs
                # again on the workers left (AllWorkersLostError when none is).
                if self.workers is None or not self.workers.drop_unreachable():
                    raise
                log.warning("round %d: lost worker(s) %s; running the round again on %d worker(s)", round_num,
                            ", ".join(self.workers.lost), len(self.workers.devices))
                self.engine.keep_devices(self.workers.devices)

    def model_weights(self) -> ModelWeights:
        return ModelWeights(trainable=self.engine.get_weights(), non_trainable=self.engine.get_non_trainable())

    def client_weights(self, client_id: str) -> tuple[ModelWeights, bool]:
        trainable, non_trainable, own = self.engine.client_weights(client_id)
        return ModelWeights(trainable, non_trainable), own

    def assign_weights_to(self, model: Any, state: Any = None) -> None:
        self.engine.assign_weights_to(model)  # straight from the engine's variables, in one traced call

    def state_leaves(self) -> list[np.ndarray]:
        return self.engine.state_leaves()

    def load_leaves(self, leaves: Sequence[np.ndarray]) -> None:
        self.engine.load_leaves(leaves)

    @property
    def ragged_leaves(self) -> tuple[int, ...]:
        return self.engine.ragged_leaves

    def evaluate_federated(self, model: Any, datasets: Sequence[Any]) -> dict[str, float]:
        from tensorfleet.federated.backends.compiled.evaluate import evaluate_batches

        return evaluate_batches(model, datasets)

    def stop(self) -> None:
        return None


class TffRounds:
    """The tff backend: the algorithm's ``tff.learning`` process on TFF's runtime (a worker this
    process owns, or remote workers), built with the aggregator's TFF form."""

    def __init__(self, simulation: Any) -> None:
        self.sim = simulation
        self.process: Any = None
        self.runtime: Any = None
        self.state: Any = None
        self._eval_process: Any = None

    def build(self) -> Any:
        """Builds (once) the learning process, and the evaluation process when there are evaluation clients."""
        if self.process is None:
            from tensorfleet.federated import algorithms

            sim, config = self.sim, self.sim.config
            if config.non_trainable == "per_client":  # auto chose tff (the model, or a tff checkpoint)
                from tensorfleet.federated.backends.compiled.local import check_per_client

                check_per_client(tff=True, received="backend='auto', which runs this simulation on tff")
            if config.non_trainable != "initial" and sim._keras_model.non_trainable_weights:
                raise ValueError(f"backend='tff' keeps a model's non-trainable weights (BatchNormalization's "
                                 f"statistics) at their initial values, as TFF's FedAvg does. Received: "
                                 f"non_trainable={config.non_trainable!r} for a model with "
                                 f"{len(sim._keras_model.non_trainable_weights)} of them; pass "
                                 f"non_trainable='initial', or run it on backend='compiled'.")
            self.runtime = sim.where.install()
            self.process = algorithms.build_process(config.algorithm, sim.tff_model_fn(), aggregator=self._aggregator(),
                                                    **config.optimizer_overrides, **config.hyperparameters)
            if sim.eval_ids:
                from tensorfleet.compat.tff import import_tff

                tff = import_tff("federated evaluation on the tff backend")
                # Built here, before any eager evaluation model: Keras invalidates models made
                # before TFF traces model_fn in a graph.
                self._eval_process = tff.learning.algorithms.build_fed_eval(sim.tff_model_fn())
        return self.process

    def _aggregator(self) -> Any:
        config = self.sim.config
        if config.aggregator is not None and not isinstance(config.aggregator, str):
            return config.aggregator  # a tff.aggregators factory
        if config.aggregator_name is None:
            return None
        from tensorfleet.federated.aggregators import build_aggregator

        return build_aggregator(config.aggregator_name, clients_per_round=config.clients_per_round,
                                **config.aggregator_options)

    def initialize(self, model: Any, max_examples: int) -> None:
        worker = getattr(self.runtime, "worker", None)
        if worker is not None and hasattr(worker, "start"):
            # Started from this thread: PR_SET_PDEATHSIG ties the worker to the thread that forks it,
            # and TFF would otherwise start it lazily from its own event-loop thread.
            worker.start()
        self.state = self.build().initialize()

    def run_round(self, round_num: int, participants: Sequence[str], work: dict[str, int]) -> dict[str, Any]:
        sampler = self.sim.sampler
        out = self.process.next(self.state, [sampler.client_dataset(self.sim.clients, c, round_num, work=work.get(c))
                                             for c in participants])
        self.state = out.state
        train = out.metrics["client_work"]["train"]
        record = {"train_loss": float(train["loss"]), "train_accuracy": float(train["accuracy"]),
                  "num_examples": int(train["num_examples"])}
        agg = out.metrics.get("aggregator")
        if isinstance(agg, dict):
            record.update({f"aggregator_{key}": float(np.asarray(agg[key]))
                           for key in ("non_finite", "clipping_norm") if key in agg})
        return record

    def model_weights(self) -> ModelWeights:
        weights = self.process.get_model_weights(self.state)
        return ModelWeights(trainable=weights.trainable, non_trainable=weights.non_trainable)

    def client_weights(self, client_id: str) -> tuple[ModelWeights, bool]:
        return self.model_weights(), False  # TFF's clients keep nothing between rounds

    ragged_leaves: tuple[int, ...] = ()

    def assign_weights_to(self, model: Any, state: Any = None) -> None:
        self.process.get_model_weights(self.state if state is None else state).assign_weights_to(model)

    def state_leaves(self) -> list[np.ndarray]:
        import tensorflow as tf

        return tf.nest.flatten(self.state)

    def load_leaves(self, leaves: Sequence[np.ndarray]) -> None:
        import tensorflow as tf

        self.state = tf.nest.pack_sequence_as(self.state, list(leaves))

    def evaluate_federated(self, model: Any, datasets: Sequence[Any]) -> dict[str, float]:
        ev = self._eval_process
        weights = self.process.get_model_weights(self.state)
        metrics = ev.next(ev.set_model_weights(ev.initialize(), weights), list(datasets)).metrics
        metrics = metrics["client_work"]["eval"]["current_round_metrics"]
        return {"fed_eval_loss": float(metrics["loss"]), "fed_eval_accuracy": float(metrics["accuracy"])}

    def stop(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()


ROUND_BACKENDS: dict[Backend, type] = {Backend.COMPILED: CompiledRounds, Backend.TFF: TffRounds}


# The weights a model had when its first engine was built (an engine trains in the model, so a
# second run of the same simulation would otherwise start from the last client's weights).
_INITIAL_WEIGHTS: "weakref.WeakKeyDictionary[Any, tuple[list[np.ndarray], list[np.ndarray]]]" = \
    weakref.WeakKeyDictionary()


def build_engine(config: Any, model_fn: Callable[[], Any], model: Any, max_examples: int,
                 devices: Sequence[str] | None = None) -> "CompiledFedAvg":
    """The engine of a :class:`~tensorfleet.federated.config.SimulationConfig` from the registries'
    parts (the algorithm's client work and server optimizer, the aggregator's compiled form),
    training in ``model`` (``model_fn()`` made eagerly) from its weights: TFF's ``initialize`` makes
    the same model from the same initializers, so no TFF process is built for them."""
    import tensorflow as tf

    from tensorfleet.federated import tff_model
    from tensorfleet.federated.aggregators import AGGREGATORS, build_part
    from tensorfleet.federated.algorithms import ALGORITHMS, make_optimizer
    from tensorfleet.federated.backends.compiled import CompiledFedAvg, RoundShape

    initial = _INITIAL_WEIGHTS.setdefault(model, ([np.asarray(w) for w in model.trainable_weights],
                                                  [np.asarray(w) for w in model.non_trainable_weights]))
    loss, _ = tff_model.loss_and_metrics(model)
    algorithm = ALGORITHMS.get(config.algorithm)
    client_optimizer = make_optimizer(config.client_opt) if config.client_opt is not None else None
    name = config.aggregator_name or "mean"
    options = dict(config.aggregator_options)
    if "delta" in AGGREGATORS.get(AGGREGATORS.canonical(name)).defaults and options.get("delta") is None:
        options["delta"] = config.dp_delta  # an aggregator that accounts its own epsilon does so at the run's delta
    part = build_part(name, clients_per_round=config.clients_per_round, seed=config.seed, options=options)
    part.check_size(sum(int(np.prod(w.shape)) for w in model.trainable_weights))  # before any client work
    with tf.init_scope():
        return CompiledFedAvg(model_fn=model_fn, loss_fn=loss, initial_weights=initial,
                              client_work=algorithm.client_work(client_optimizer, config.hyperparameters),
                              aggregator=part, server_optimizer=make_optimizer(config.server_opt),
                              shape=RoundShape(config.batch_size, max_examples * config.local_epochs,
                                               config.clients_per_round),
                              seed=config.seed, model=model, non_trainable=config.non_trainable, devices=devices)

