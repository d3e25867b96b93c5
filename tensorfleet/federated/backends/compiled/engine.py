"""The compiled backend's engine: a federated round as compiled TensorFlow functions, outside TFF,
composed from the registries' parts (why: docs/explanation-federated-backends.md; how:
docs/explanation-federated-engine.md).

:class:`CompiledFedAvg` runs TFF's arithmetic (``compose_learning_process``: distributor, client
work, aggregator, finalizer) as one function traced once (without AutoGraph: its loops are
explicit): the algorithm's client work (:func:`~tensorfleet.federated.backends.compiled.client.client_update`)
on the batches TFF's dataset would give, the aggregator's compiled form
(:class:`~tensorfleet.federated.aggregators.parts.AggregatorPart`; a ``host`` aggregator's ``aggregate``
runs in Python between the compiled client work and the compiled server step), and the server
optimizer. The sampled clients' examples come as one padded array ``[clients, steps * batch, ...]``;
``tf.while_loop`` loops, one per lane (a lane per core, or per TensorFlow worker:
:mod:`~tensorfleet.federated.backends.compiled.workers`), each in its own copy of the model, train
the participants side by side. A client with a non-finite update gets weight 0, as in TFF. The server's
weights, optimizer state, non-trainable weights and the aggregator's state stay in variables the round
updates in place. The initial weights are ``model_fn()``'s, made eagerly, as TFF's ``initialize`` makes
them. ``tests/federated/backends/test_compiled.py`` holds both backends equal after the same rounds.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tensorfleet.compat.keras import model_variables
from tensorfleet.federated.aggregators.parts import AggregatorPart, ClientUpdates, RoundContext
from tensorfleet.federated.backends.compiled.client import add_non_trainable, client_update
from tensorfleet.federated.backends.compiled.layout import (
    NonTrainable,
    RoundShape,
    default_lanes,
    flatten,
    fori,
    lane_clients,
    pad_clients,
    trace_round,
)
from tensorfleet.federated.backends.compiled.local import LocalLayers, check_per_client
from tensorfleet.federated.backends.compiled.state import ServerVariables

__all__ = ["CompiledFedAvg"]

class CompiledFedAvg(ServerVariables):
    """Federated rounds as compiled TensorFlow functions, composed from parts.

    Args:
        model_fn: returns the (uncompiled) Keras model.
        loss_fn: the batch loss ``loss_fn(y, logits)`` as TFF's ``from_keras_model`` applies it.
        initial_weights: ``(trainable, non_trainable)`` weights to start from (TFF's initial model);
            a plain list is the trainable ones.
        client_work: the algorithm's client part
            (:class:`~tensorfleet.federated.algorithms.client_work.ClientWork`).
        aggregator: the aggregator's compiled form (:class:`~tensorfleet.federated.aggregators.parts.AggregatorPart`).
        server_optimizer: the finalizer: applies the aggregate update to the server weights
            (:mod:`~tensorfleet.federated.algorithms.optimizers`, or anything with ``initialize``/``next``).
        shape: the round's layout (:class:`RoundShape`).
        seed: the simulation's seed (DP noise, a host part's draws).
        model: a model ``model_fn()`` already made, to train in (else one is made).
        non_trainable: :class:`NonTrainable` (``mean`` by default; ``per_client``: FedBN,
            :mod:`~tensorfleet.federated.backends.compiled.local`).
        devices: the devices of TensorFlow workers this process joined
            (:mod:`~tensorfleet.federated.backends.compiled.workers`): one lane on each, its model made there;
            None: the lanes run here.
    """

    def __init__(self, *, model_fn: Callable[[], Any], loss_fn: Any, initial_weights: Any, client_work: Any,
                 aggregator: AggregatorPart, server_optimizer: Any, shape: RoundShape, seed: int = 0,
                 model: Any = None, non_trainable: str | NonTrainable = NonTrainable.MEAN,
                 devices: Sequence[str] | None = None) -> None:
        import tensorflow as tf

        from tensorfleet.validation import choice

        self.model = model if model is not None else model_fn()
        self._model_fn = model_fn
        # Runs a round's traced call, its tensors read back (on workers: WorkerSet.call, which can abandon it).
        self.invoke: Callable[..., Any] = lambda fn, *args: tf.nest.map_structure(lambda t: t.numpy(), fn(*args))
        self.variables = model_variables(self.model)[0]
        trainable, frozen = (initial_weights if isinstance(initial_weights, tuple)
                             else (initial_weights, [np.asarray(w) for w in self.model.non_trainable_weights]))
        if len(self.variables) != len(trainable):
            raise ValueError(f"initial_weights has {len(trainable)} tensors; the model has {len(self.variables)}.")
        lanes = default_lanes(shape.clients_per_round) if shape.lanes is None else shape.lanes
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise ValueError(f"lanes must be a positive integer (clients trained at once). Received: {lanes!r}")
        # Each lane's model, trainable and non-trainable variables: the first lane trains in ``model``; on
        # workers, each lane's model is made on its worker (one lane a worker).
        self._devices = list(devices or [])
        if self._devices:
            copies = []
            for device in self._devices:
                with tf.device(device):
                    copies.append(model_fn())
            self._lanes = [(m, *model_variables(m)) for m in copies]
        else:
            copies = [model_fn() for _ in range(min(lanes, int(shape.clients_per_round)) - 1)]
            self._lanes = [(m, *model_variables(m)) for m in [self.model, *copies]]
        self.batch_size = int(shape.batch_size)
        self.steps = -(-int(shape.max_examples) // self.batch_size)
        self.length = self.steps * self.batch_size
        self.clients_per_round = int(shape.clients_per_round)
        self.loss_fn, self.client_work, self.part = loss_fn, client_work, aggregator
        self.server_optimizer, self.seed = server_optimizer, int(seed)
        self.non_trainable = choice(NonTrainable, "non_trainable", non_trainable)
        self._local = LocalLayers(self.model) if self.non_trainable is NonTrainable.PER_CLIENT else None
        if self._local is not None:
            check_per_client(tff=False, received="this client work", local_steps=client_work.local_steps)
            self._local = self._local if self._local.size else None  # nothing of its own: FedAvg's round
        specs = [tf.TensorSpec(v.shape, v.dtype) for v in self.variables]
        self._specs, self._sizes = specs, tuple(int(np.prod(w.shape)) for w in specs)
        # The server's model, optimizer state, non-trainable weights and the aggregator's state live
        # in variables the round updates in place: a call passes only the round's data.
        self._weight_vars = [tf.Variable(w, dtype=v.dtype, trainable=False) for w, v in zip(trainable, self.variables)]
        self._frozen_vars = [tf.Variable(w, trainable=False) for w in frozen]
        self._frozen_sizes = [int(np.prod(np.shape(w))) for w in frozen]
        if self._local is not None:  # FedBN: the shared weights' mask and the round's per-client rows
            self._shared = tf.constant(self._local.shared_mask(self._sizes))
            self._local_rows = tf.Variable(tf.zeros([self.clients_per_round, self._local.size]), trainable=False)
        self._state_vars = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False),
                                                 server_optimizer.initialize(tuple(specs)))
        self._part_keys = sorted(aggregator.initial_state())
        initial_state = aggregator.initial_state()
        self._part_vars = {k: tf.Variable(initial_state[k], trainable=False) for k in self._part_keys}
        self._metric_keys: list[str] = []  # the aggregator's metrics, in the order the round returns them
        self._round: Any = None  # traced on the first round, when the data's shapes are known
        self._apply: Any = None  # a host part's server step
        self._copy: Any = None  # (model, traced copy of the server's weights into it): assign_weights_to

    def keep_devices(self, devices: Sequence[str], *, rebuild: bool = False) -> None:
        """Keeps the lanes on ``devices`` only (workers left after some were lost); the round is traced again.
        ``rebuild``: each lane left gets a new model (a call abandoned on a frozen worker may still be training
        in the old ones)."""
        import tensorflow as tf

        kept = [(lane, d) for lane, d in zip(self._lanes, self._devices) if d in set(devices)]
        self._lanes, self._devices = [lane for lane, _ in kept], [d for _, d in kept]
        if rebuild:
            with tf.init_scope():
                for j, device in enumerate(self._devices):
                    with tf.device(device):
                        model = self._model_fn()
                    self._lanes[j] = (model, *model_variables(model))
        self._round = self._apply = None

    @property
    def clip(self) -> Any:
        """The aggregator's current clip (DP), or None."""
        return self._part_vars["clip"].read_value() if "clip" in self._part_vars else None

    def pack(self, clients: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
        """Pads the clients' (already ordered) examples into the round's arrays; a client with more
        examples than the round was traced for (data made on request is not measured ahead) makes the
        round be traced again, for the longer padding."""
        if len(clients) > self.clients_per_round:
            raise ValueError(f"At most {self.clients_per_round} clients per round. Received: {len(clients)}")
        longest = max(len(yk) for _, yk in clients)
        if longest > self.length:
            self.steps = -(-longest // self.batch_size)
            self.length = self.steps * self.batch_size
            self._round = self._apply = None
        return pad_clients(clients, self.clients_per_round, self.length)

    def _context(self, round_num: Any) -> RoundContext:
        return RoundContext(round_num=round_num, seed=self.seed, clients_per_round=self.clients_per_round,
                            sizes=self._sizes)

    def _train_clients(self, weights: list[Any], frozen: list[Any], x: Any, y: Any, examples: Any, participants: Any,
                       part_state: dict[str, Any], ctx: RoundContext) -> Any:
        """Trains the participants, lane ``j`` taking clients ``j, j + lanes, ...`` in its own loop, each
        client's update handed to the aggregator's ``client``: ``(ClientUpdates, [weight sum, loss sum,
        correct sum, examples, weighted steps], the weighted sum of the clients' non-trainable weights)``."""
        import tensorflow as tf

        lanes, d, part, local = len(self._lanes), sum(self._sizes), self.part, self._local
        rows_kept = part.rows or part.host
        flat_weights = flatten(weights)
        mean_frozen = self.non_trainable is NonTrainable.MEAN and bool(frozen)
        local_in = self._local_rows.read_value() if local is not None else None
        carried = self._carried(d, mean_frozen)
        n_sums = 5 if self.client_work.normalized else 4

        def client(lane: Any, j: int, i: Any, acc: Any, data: tuple[Any, ...]) -> Any:
            acc = dict(acc)
            # ``data``: the round's (x, y, examples, FedBN rows), or on a worker only its lane's clients'.
            k = i if self._devices else j + i * lanes
            xs, ys, counts, rows_in = data
            start, frozen_k, flat_k = ((weights, frozen, flat_weights) if local is None
                                       else local.start(weights, rows_in[k], self._specs, self._frozen_vars))
            if "frozen" in carried:
                for v, w in zip(lane[2], frozen_k):
                    v.assign(w)
            update, sums_k, steps = client_update(self.client_work, self.loss_fn, self.batch_size, self._specs, lane,
                                                  start, flat_k, xs[k], ys[k], counts[k])
            if local is not None:  # FedBN: the BN layers' weights are not sent
                update = update * self._shared
            finite = tf.reduce_all(tf.math.is_finite(update))
            n_k = tf.cast(counts[k], tf.float32)
            weight = tf.where(finite, n_k, 0.0)
            # A branch, not tf.where: a finite update (every one, nearly always) passes on uncopied.
            update = tf.cond(finite, lambda: update, lambda: tf.zeros_like(update))
            value, aux_k = part.client(update, weight, part_state, ctx)
            own = {"value": value, "aux": aux_k, "weight": weight}
            if "frozen" in carried:
                acc = add_non_trainable(acc, lane, i, weight, local)
            for key in ("value", "aux"):
                if key in carried:
                    acc[key] = acc[key].write(i, own[key]) if rows_kept else acc[key] + own[key]
            if rows_kept:
                acc["weight"] = acc["weight"].write(i, weight)
            sums = [weight, sums_k[0], sums_k[1], n_k] + ([weight * steps] if n_sums == 5 else [])
            acc["sums"] = acc["sums"] + tf.stack(sums)
            return acc

        outs = []
        for j, lane in enumerate(self._lanes):  # independent loops: TensorFlow runs them side by side
            data = lane_clients((x, y, examples, local_in), j, lanes, self.clients_per_round, self._devices)
            with tf.device(self._devices[j] if self._devices else None):
                outs.append(self._lane_loop(lane, j, weights, participants, carried, rows_kept, n_sums, data, client))
        return self._gather(outs, carried, participants)

    def _carried(self, d: int, mean_frozen: bool) -> dict[str, list[int]]:
        """The shapes a lane's loop carries: only what this round's parts use, since every value it carries
        costs each client's iteration (FedAvg x mean carries the updates' sum and four sums alone)."""
        carried = {"value": [d], "weight": []}
        if self.part.aux_size:
            carried["aux"] = [self.part.aux_size]
        if mean_frozen or self._local is not None:
            carried["frozen"] = [self._frozen_sum_size]
        return carried

    def _lane_loop(self, lane: Any, j: int, weights: list[Any], participants: Any, carried: dict[str, list[int]],
                   rows_kept: bool, n_sums: int, data: tuple[Any, ...], client: Any) -> Any:
        """Lane ``j``'s loop over its clients ``j, j + lanes, ...`` (on its worker, under the caller's device)."""
        import tensorflow as tf

        lanes, local = len(self._lanes), self._local
        if not self.client_work.local_steps:  # (FedSGD's clients all compute at the server weights)
            for v, w in zip(lane[1], weights):
                v.assign(w)
        n = (participants - j + lanes - 1) // lanes  # (never negative: j < lanes)
        init: dict[str, Any] = {"sums": tf.zeros([n_sums])}
        for key, shape in carried.items():
            if key == "frozen":
                init[key] = tf.zeros(shape)
            elif rows_kept:
                init[key] = tf.TensorArray(tf.float32, size=n, element_shape=shape)
            elif key != "weight":  # (the weights' sum is the first of the sums)
                init[key] = tf.zeros(shape)
        if local is not None:
            init["local"] = tf.TensorArray(tf.float32, size=n, element_shape=[local.size])
        return fori(n, lambda i, acc: client(lane, j, i, acc, data), init)

    def _gather(self, outs: list[dict[str, Any]], carried: dict[str, list[int]], participants: Any) -> Any:
        """The lanes' loop results as the round's ``(ClientUpdates, sums, non-trainable sum)``: sums added,
        rows (a part that keeps them, FedBN's) scattered into their clients' slots."""
        import tensorflow as tf

        lanes, d, part, local = len(self._lanes), sum(self._sizes), self.part, self._local
        rows_kept = part.rows or part.host
        sums = tf.add_n([o["sums"] for o in outs])
        if not self.client_work.normalized:  # (the weighted steps only FedNova uses)
            sums = tf.concat([sums, tf.zeros([1])], 0)
        frozen_sum = (tf.add_n([o["frozen"] for o in outs]) if "frozen" in carried
                      else tf.zeros([self._frozen_sum_size]))
        slots = [tf.range(j, participants, lanes)[:, None]
                 for j in range(lanes)] if rows_kept or local is not None else []

        def rows(key: str, tail: list[int]) -> Any:
            """Every lane's rows of ``key`` into their clients' slots (zeros for a value not carried)."""
            if key not in outs[0]:
                return tf.zeros([self.clients_per_round, *tail])
            return tf.add_n([tf.scatter_nd(slot, o[key].stack(), [self.clients_per_round, *tail])
                             for slot, o in zip(slots, outs)])

        if local is not None:  # every lane's BN rows into their clients' slots, read back after the round
            self._local_rows.assign(rows("local", [local.size]))
        if rows_kept:
            return (ClientUpdates(rows("value", [d]), rows("aux", [part.aux_size]), rows("weight", []), participants),
                    sums, frozen_sum)
        aux = tf.add_n([o["aux"] for o in outs]) if "aux" in carried else tf.zeros([0])
        return ClientUpdates(tf.add_n([o["value"] for o in outs]), aux, sums[0], participants), sums, frozen_sum

    def _unflatten(self, flat: Any) -> list[Any]:
        """A flat vector of the model's trainable weights as one tensor per weight."""
        import tensorflow as tf

        return [tf.reshape(p, spec.shape) for p, spec in zip(tf.split(flat, list(self._sizes)), self._specs)]

    def _read(self) -> tuple[list[Any], list[Any], dict[str, Any]]:
        """The server's weights, non-trainable weights and the aggregator's state, read in the graph."""
        return ([v.read_value() for v in self._weight_vars], [v.read_value() for v in self._frozen_vars],
                {k: v.read_value() for k, v in self._part_vars.items()})

    def _round_impl(self, x: Any, y: Any, examples: Any, participants: Any, round_num: Any) -> Any:
        """One round in the graph (an aggregator that is not ``host``): reads the server variables,
        trains, aggregates, writes them; returns ``[train loss, train accuracy, examples, *metrics]``."""
        import tensorflow as tf

        weights, frozen, part_state = self._read()
        ctx = self._context(round_num)
        updates, sums, frozen_sum = self._train_clients(weights, frozen, x, y, examples, participants, part_state, ctx)
        update, new_part_state, metrics = self.part.aggregate(part_state, updates, ctx)
        for key in self._part_keys:
            self._part_vars[key].assign(tf.cast(new_part_state[key], self._part_vars[key].dtype))
        self._metric_keys = sorted(metrics)
        out = self._finish(weights, update, sums, frozen_sum)
        if not self._metric_keys:
            return out
        return tf.concat([out, tf.stack([tf.cast(metrics[k], tf.float32) for k in self._metric_keys])], 0)

    def _train_impl(self, x: Any, y: Any, examples: Any, participants: Any, round_num: Any) -> Any:
        """A ``host`` aggregator's first step in the graph: the clients' rows, aux, weights, sums and non-trainable
        sum."""
        weights, frozen, part_state = self._read()
        updates, sums, frozen_sum = self._train_clients(weights, frozen, x, y, examples, participants, part_state,
                                                        self._context(round_num))
        return updates.values, updates.aux, updates.weights, sums, frozen_sum

    def _apply_impl(self, update: Any, sums: Any, frozen_sum: Any) -> Any:
        """A ``host`` aggregator's last step in the graph: the server step from its update."""
        weights = [v.read_value() for v in self._weight_vars]
        return self._finish(weights, update, sums, frozen_sum)

    def _finish(self, weights: list[Any], update: Any, sums: Any, frozen_sum: Any) -> Any:
        """The finalizer: the server optimizer applies ``update`` (FedNova's rescaled), the
        non-trainable weights become the clients' mean (``mean``); returns ``[loss, accuracy, examples]``."""
        import tensorflow as tf

        weight_sum, loss_sum, correct_sum, seen, steps_sum = tf.unstack(sums)
        if self.client_work.normalized:  # FedNova: tau_eff, the example-weighted mean of the local steps
            update = update * (steps_sum / tf.maximum(weight_sum, 1e-30))
        server_state = tf.nest.map_structure(lambda v: v.read_value(), self._state_vars)
        new_state, new_weights = self.server_optimizer.next(server_state, tuple(weights),
                                                            tuple(self._unflatten(update)))
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(w)) for w in new_weights])
        for var, new, old in zip(self._weight_vars, new_weights, weights):
            var.assign(tf.where(finite, new, old))
        tf.nest.map_structure(lambda var, value: var.assign(value), self._state_vars, new_state)
        if self._frozen_sum_size:  # the clients' mean: statistics (mean), or FedBN's BN layers (per_client)
            mean = frozen_sum / tf.maximum(weight_sum, 1e-30)
            targets = [self._weight_vars[t] for t in self._local.trainable] if self._local is not None else []
            targets += self._frozen_vars
            for var, value in zip(targets, tf.split(mean, [int(np.prod(v.shape)) for v in targets])):
                var.assign(tf.where(weight_sum > 0, tf.reshape(value, var.shape), var.read_value()))
        return tf.stack([loss_sum / seen, correct_sum / seen, seen])

    def next(self, clients: Sequence[tuple[np.ndarray, np.ndarray]], round_num: int = 0,
             client_ids: Sequence[str] = ()) -> dict[str, float]:
        """Runs round ``round_num`` over ``clients`` (each ``(x, y)`` in training order; ``client_ids``
        their ids, for a ``host`` aggregator and FedBN); returns the train metrics and the aggregator's."""
        x, y, examples = self.pack(clients)
        args = (x, y, examples, np.int32(len(clients)), np.int64(round_num))
        if self._local is not None:  # FedBN: each participant's own BN layers (or the server's) into the round
            if len(client_ids) != len(clients):
                raise ValueError(f"non_trainable='per_client' needs the participants' ids. Received: "
                                 f"{len(client_ids)} ids for {len(clients)} clients")
            server = self._local.server_row(self.get_weights(), self.get_non_trainable())
            self._local_rows.assign(self._local.rows(client_ids, server, self.clients_per_round))
        if self.part.host:
            record = self._next_host(args, client_ids)
        else:
            if self._round is None:
                self._round = trace_round(self._round_impl, x, y)
            out = self.invoke(self._round, *args).tolist()
            record = self._record(out[:3], dict(zip(self._metric_keys, out[3:])))
        if self._local is not None:
            self._local.keep(client_ids, self._local_rows.numpy()[:len(clients)])
        return record

    def _next_host(self, args: tuple[Any, ...], client_ids: Sequence[str]) -> dict[str, float]:
        """A round of a ``host`` aggregator: compiled client work, ``aggregate`` in Python, compiled server
        step; when ``aggregate`` raises, nothing of the server changes."""
        import tensorflow as tf

        if self._round is None:
            self._round = trace_round(self._train_impl, args[0], args[1])
            d = sum(self._sizes)
            self._apply = tf.function(self._apply_impl, autograph=False).get_concrete_function(
                tf.TensorSpec([d], tf.float32), tf.TensorSpec([5], tf.float32),
                tf.TensorSpec([self._frozen_sum_size], tf.float32))
        values, aux, weights, sums, frozen_sum = self.invoke(self._round, *args)
        p = int(args[3])
        updates = ClientUpdates(values[:p], aux[:p], weights[:p], p, tuple(client_ids))
        state = {k: v.numpy() for k, v in self._part_vars.items()}
        update, new_state, metrics = self.part.aggregate(state, updates, self._context(int(args[4])))
        out = self._apply(tf.constant(np.asarray(update, np.float32)), tf.constant(sums),
                          tf.constant(frozen_sum)).numpy().tolist()
        for key in self._part_keys:
            self._part_vars[key].assign(np.asarray(new_state[key], self._part_vars[key].dtype.as_numpy_dtype))
        return self._record(out, {k: float(np.asarray(v)) for k, v in metrics.items()})

    @property
    def _frozen_sum_size(self) -> int:
        """The length of the clients' weighted sum the server averages (``mean``'s statistics, FedBN's rows)."""
        if self._local is not None:
            return self._local.size
        return sum(self._frozen_sizes) if self.non_trainable is NonTrainable.MEAN else 0

    @staticmethod
    def _record(out: list[float], metrics: dict[str, float]) -> dict[str, float]:
        loss, accuracy, seen = out
        return {"train_loss": loss, "train_accuracy": accuracy, "num_examples": int(seen),
                **{f"aggregator_{k}": v for k, v in metrics.items()}}

    def get_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self._weight_vars]

    def get_non_trainable(self) -> list[np.ndarray]:
        return [v.numpy() for v in self._frozen_vars]

    @property
    def local_states(self) -> dict[str, np.ndarray]:
        """FedBN: client id -> its BN layers' row, for the clients sampled so far (else empty)."""
        return dict(self._local.states) if self._local is not None else {}

    def client_weights(self, client_id: str) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
        """``(trainable, non_trainable, own)``: the weights client ``client_id`` evaluates with: the server's,
        with its own BN layers under FedBN (``own``; False: the server's, it has none or there is no FedBN)."""
        if self._local is None:
            return self.get_weights(), self.get_non_trainable(), False
        return self._local.client(client_id, self.get_weights(), self.get_non_trainable())

    def assign_weights_to(self, model: Any) -> None:
        """Sets ``model``'s weights (a model of ``model_fn``) to the server's, in one traced call."""
        import tensorflow as tf

        if self._copy is None or self._copy[0] is not model:
            trainable, non_trainable = model_variables(model)
            pairs = [*zip(trainable, self._weight_vars), *zip(non_trainable, self._frozen_vars)]

            def copy() -> None:
                for target, value in pairs:
                    target.assign(value)
            self._copy = (model, tf.function(copy, autograph=False))
        self._copy[1]()
