"""The ``compiled`` backend: a whole FedAvg-family, FedProx or FedSGD round as one TensorFlow function, outside TFF.

Where the time of a TFF simulation goes, measured on this stack (bench/federated_speed.py):
every round builds one ``tf.data`` dataset per client, TFF serializes them (with their data) to
its C++ worker over gRPC, the worker runs the round, and the result comes back as Python values.
With small models nearly all of it is that per-round traffic and per-client Python, not the
arithmetic.

This backend runs the same arithmetic as TFF's ``build_weighted_fed_avg`` (TFF's model-delta
client work and apply-optimizer finalizer) in one TensorFlow function traced once (without
AutoGraph: its loops are explicit): the sampled clients' examples come as one padded array
``[clients, steps * batch, ...]`` with each client's count, ``tf.while_loop`` loops (one per lane: a
lane per CPU core, each in its own copy of the model, run side by side) train each client
on the batches TFF's dataset would give (the real rows only: padding never enters the model) from the
server weights with the client optimizer (:mod:`~tensorfleet.federated.algorithms.optimizers`: TFF's
update rules and state, without TFF), the
deltas ``initial - trained`` are averaged weighted by examples (a client with a non-finite delta
gets weight 0, as in TFF), and the server optimizer (again TFF's rules) applies the mean delta. The
server weights, optimizer state and DP clip stay in variables the round updates in place, so a
round's call takes its data and returns three numbers. FedProx adds ``mu * (w - w_server)`` to
every local gradient, the gradient of the paper's proximal term ``(mu / 2) ||w - w_server||^2``
(Li et al., MLSys 2020; TFF 0.87's ``proximal_client_work`` adds it with the opposite sign).
FedSGD takes no local steps: a client's update is its batch gradients at the server weights
averaged weighted by batch size (TFF's ``build_fed_sgd``). The initial weights are
``model_fn()``'s, made eagerly: TFF's ``initialize`` makes the same model from the same
initializers, so no TFF process, worker or tracing is needed before the first round, and
federated evaluation runs in this process too
(:func:`~tensorfleet.federated.backends.compiled_eval.evaluate_batches`).
``tests/federated/backends/test_compiled.py`` checks that both backends give the same model and
metrics after the same rounds.

Supported: ``fedsgd``, ``fedprox`` and the algorithms built on weighted FedAvg (``fedavg``,
``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``) with the aggregators of
:data:`COMPILED_AGGREGATORS` (the mean; DP with fixed or adaptive clipping, TFF's clipping, noise
and clip-update rules with the noise drawn statelessly from the seed and the round; compression;
median, trimmed mean, Krum), client dropout and stragglers, on ``partition()`` client data,
and models whose rows do not mix at inference (BatchNormalization included: the server keeps the
non-trainable weights at their initial values, as TFF's FedAvg does); a layer that mixes rows is
found by a probe (:func:`batch_dependent_layers`) before the first round, and ``backend="auto"``
runs such models on TFF (tff track).
"""

from __future__ import annotations

import functools
import os
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tensorfleet.federated.backends.compiled_aggregation import (
    ROBUST_AGGREGATORS, adapted_clip, aggregation, dp_noised_mean,
)
from tensorfleet.federated.backends.compiled_eval import one_label_per_example
from tensorfleet.federated.backends.compiled_scope import (
    COMPILED_AGGREGATORS, SUPPORTED_ALGORITHMS, batch_dependent_layers, compiled_refusal, unsupported,
)

__all__ = ["COMPILED_AGGREGATORS", "ROBUST_AGGREGATORS", "SUPPORTED_ALGORITHMS", "CompiledFedAvg", "aggregation",
           "batch_dependent_layers", "build_engine", "compiled_refusal", "default_lanes", "dp_noised_mean", "adapted_clip", "unsupported"]

# The weights a model had when its first engine was built (an engine trains in the model, so a
# second run of the same simulation would otherwise start from the last client's weights).
_INITIAL_WEIGHTS: "weakref.WeakKeyDictionary[Any, list[np.ndarray]]" = weakref.WeakKeyDictionary()

def default_lanes(clients_per_round: int, cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Clients trained at once by default: one per CPU core this process may use (its CPU affinity,
    and a container's CPU quota from ``cpu_max``, cgroup v2's ``"<quota> <period>"``, rounded up),
    at most ``clients_per_round``. On two cores two lanes ran 113 rounds/s of the digits CNN, one 81
    and three or four 93 (bench/RESULTS.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cores = min(cores, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable: the affinity alone
    return max(1, min(int(clients_per_round), cores))


class CompiledFedAvg:
    """FedAvg-family rounds as one compiled TensorFlow function.

    Args:
        model_fn: returns the (uncompiled) Keras model.
        loss_fn: the batch loss ``loss_fn(y, logits)`` as TFF's ``from_keras_model`` applies it (the
            Keras loss with its default reduction, the mean over the batch).
        client_optimizer: an optimizer for local steps (:mod:`~tensorfleet.federated.algorithms.optimizers`,
            or anything with its ``initialize``/``next``, such as a ``tff.learning.optimizers.Optimizer``).
        server_optimizer: an optimizer for the mean delta (the same kind).
        initial_weights: trainable weights to start from (TFF's initial model).
        batch_size: local batch size.
        max_examples: the most examples (times local epochs) any client trains on in a round.
        clients_per_round: the padded number of clients per round.
        mu: FedProx's proximal strength: ``mu * (w - w_server)`` joins every local gradient, the
            gradient of the paper's proximal term ``(mu / 2) ||w - w_server||^2`` (0: FedAvg).
        local_steps: False for FedSGD (TFF's ``build_fed_sgd``): a client takes no steps; its
            update is its batch gradients averaged weighted by batch size, at the server weights.
        statistic: None for the example-weighted mean; else an unweighted rule (such as
            :meth:`~tensorfleet.federated.aggregators.robust.RobustStatistic.statistic`) applied to
            the round's flattened updates stacked ``[participants, d]``, as TFF's unweighted
            algorithms apply it (a non-finite update enters as zeros).
        compress: None, or what is applied to every tensor of ``examples * update`` before the
            sum of TFF's ``MeanFactory(value_sum_factory=CompressionFactory)``, given the round's
            clients' values of one tensor as rows ``[clients, size]`` and applied to each (the ``compression``
            aggregator).
        dp_clip, dp_noise: DP-FedAvg (TFF's ``DifferentiallyPrivateFactory``): every update
            clipped to global L2 norm ``dp_clip`` (``tf.clip_by_global_norm``), summed, Gaussian
            noise of ``dp_noise * clip`` added (drawn statelessly from ``noise_seed`` and the
            round), divided by ``clients_per_round``.
        dp_adaptive: None (fixed clipping), or ``(target_quantile, learning_rate,
            clipped_count_stddev)`` of TFF's adaptive clipping (``gaussian_adaptive``, Andrew et
            al. 2021): after each round the clip becomes ``clip * exp(-lr * (unclipped - target))``
            where ``unclipped`` is the noised fraction of updates whose norm was at most the clip.
        noise_seed: seeds the DP noise.
        model: a model ``model_fn()`` already made, to train in (else one is made).
        lanes: how many clients train at once, each lane in its own copy of the model (made by
            ``model_fn()``) and its own ``tf.while_loop``, which TensorFlow runs side by side
            (default: :func:`default_lanes`). Small models leave most of a core idle in one
            client's step; the result is the same up to the order of the sums.
    """

    def __init__(self, *, model_fn: Callable[[], Any], loss_fn: Any, client_optimizer: Any, server_optimizer: Any,
                 initial_weights: Sequence[np.ndarray], batch_size: int, max_examples: int,
                 clients_per_round: int, mu: float = 0.0, local_steps: bool = True,
                 statistic: Callable[[Any], Any] | None = None, compress: Callable[[Any], Any] | None = None,
                 dp_clip: float | None = None, dp_noise: float = 0.0,
                 dp_adaptive: tuple[float, float, float] | None = None, noise_seed: int = 0,
                 model: Any = None, lanes: int | None = None) -> None:
        import tensorflow as tf

        self.model = model if model is not None else model_fn()
        self.variables = list(self.model.trainable_variables)
        if len(self.variables) != len(initial_weights):
            raise ValueError(f"initial_weights has {len(initial_weights)} tensors; the model has {len(self.variables)}.")
        lanes = default_lanes(clients_per_round) if lanes is None else lanes
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise ValueError(f"lanes must be a positive integer (clients trained at once). Received: {lanes!r}")
        # Each lane's model and its trainable variables: the first lane trains in ``model``, the others in copies.
        copies = [model_fn() for _ in range(min(lanes, int(clients_per_round)) - 1)]
        self._lanes = [(self.model, self.variables), *((m, list(m.trainable_variables)) for m in copies)]
        self.batch_size = int(batch_size)
        self.steps = -(-int(max_examples) // self.batch_size)
        self.length = self.steps * self.batch_size
        self.clients_per_round = int(clients_per_round)
        self.loss_fn = loss_fn
        self.client_optimizer = client_optimizer
        self.server_optimizer = server_optimizer
        self.mu = float(mu)
        self.local_steps = bool(local_steps)
        self.statistic = statistic
        self.compress = compress
        self.dp_clip, self.dp_noise, self.noise_seed = dp_clip, float(dp_noise), int(noise_seed)
        self.dp_adaptive = dp_adaptive
        specs = [tf.TensorSpec(v.shape, v.dtype) for v in self.variables]
        self._specs = specs
        self._sizes = [int(np.prod(w.shape)) for w in specs]
        # The server's model, optimizer state and clip live in variables the round updates in
        # place: a call passes only the round's data, and returns only its three metrics.
        self._weight_vars = [tf.Variable(w, dtype=v.dtype, trainable=False) for w, v in zip(initial_weights, self.variables)]
        self._state_vars = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False),
                                                 server_optimizer.initialize(tuple(specs)))
        self._clip_var = tf.Variable(float(dp_clip or 0.0), dtype=tf.float32, trainable=False)
        self._round: Any = None  # traced on the first round, when the data's shapes are known
        self._copy: Any = None  # (model, traced copy of the server's weights into it): assign_weights_to

    @property
    def clip(self) -> Any:
        """The current DP clip (adapted each round by adaptive clipping)."""
        return self._clip_var.read_value()

    # The padded client batch: x [K, L, ...], y [K, L], examples [K] (the real rows of each).
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
            self._round = None
        # One label per example: labels shaped [1] (as TFF's tutorials reshape them) are the same labels.
        clients = [(xk, one_label_per_example(yk)) for xk, yk in clients]
        x0, y0 = clients[0]
        x = np.zeros((self.clients_per_round, self.length, *x0.shape[1:]), dtype=x0.dtype)
        y = np.zeros((self.clients_per_round, self.length), dtype=y0.dtype)
        examples = np.zeros((self.clients_per_round,), dtype=np.int32)
        for k, (xk, yk) in enumerate(clients):
            n = len(yk)
            x[k, :n], y[k, :n], examples[k] = xk, yk, n
        return x, y, examples

    def _client_update(self, lane: tuple[Any, list[Any]], weights: list[Any], flat_weights: Any, xk: Any, yk: Any,
                       n: Any) -> tuple[Any, Any]:
        """One client's ``(update, [loss sum, correct sum])``, the update flat: the delta ``initial -
        trained`` after local steps, or (FedSGD) the example-weighted mean of its batch gradients."""
        import tensorflow as tf

        B = self.batch_size
        model, variables = lane
        if self.local_steps:  # (FedSGD's clients all start where the round set the model)
            for v, w in zip(variables, weights):
                v.assign(w)
        opt_state = self.client_optimizer.initialize(tuple(self._specs)) if self.local_steps else ()
        # Only FedSGD sums gradients: no loop variables that a step does not change.
        grad_sum = () if self.local_steps else tf.zeros_like(flat_weights)

        def step(s: Any, carry: Any) -> Any:
            opt_state, grad_sum, sums = carry
            # The batch TFF's dataset would give: its real rows only, so no padding enters the model.
            end = tf.minimum((s + 1) * B, n)
            xb, yb = xk[s * B:end], yk[s * B:end]
            rows = tf.cast(end - s * B, tf.float32)
            with tf.GradientTape() as tape:
                logits = model(xb, training=True)
                loss = self.loss_fn(yb, logits)
            grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            if self.local_steps:
                current = tuple(v.read_value() for v in variables)
                if self.mu > 0.0:  # the gradient of (mu / 2) ||w - w_server||^2
                    grads = [g + self.mu * (c - w) for g, c, w in zip(grads, current, weights)]
                opt_state, updated = self.client_optimizer.next(opt_state, current, tuple(grads))
                for v, u in zip(variables, updated):
                    v.assign(u)
            else:
                grad_sum = grad_sum + rows * _flatten(grads)
            hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=yb.dtype), yb), tf.float32)
            return opt_state, grad_sum, sums + tf.stack([loss * rows, tf.reduce_sum(hits)])

        _, grad_sum, sums = _fori((n + B - 1) // B, step, (opt_state, grad_sum, tf.zeros([2])))
        if self.local_steps:
            return flat_weights - _flatten([v.read_value() for v in variables]), sums
        return grad_sum / tf.cast(n, tf.float32), sums

    def _unflatten(self, flat: Any) -> list[Any]:
        """A flat vector of the model's trainable weights as one tensor per weight."""
        import tensorflow as tf

        return [tf.reshape(p, spec.shape) for p, spec in zip(tf.split(flat, self._sizes), self._specs)]

    def _round_impl(self, x: Any, y: Any, examples: Any, participants: Any, round_num: Any) -> Any:
        """One round in the graph: reads the server variables, trains, writes them; returns
        ``[train loss, train accuracy, examples]``."""
        import tensorflow as tf

        weights = [v.read_value() for v in self._weight_vars]
        server_state = tf.nest.map_structure(lambda v: v.read_value(), self._state_vars)
        clip = self._clip_var.read_value()
        new_weights, new_state, loss, accuracy, seen, clip = self._aggregate_round(
            weights, server_state, x, y, examples, participants, round_num, clip)
        for var, value in zip(self._weight_vars, new_weights):
            var.assign(value)
        tf.nest.map_structure(lambda var, value: var.assign(value), self._state_vars, new_state)
        self._clip_var.assign(clip)
        return tf.stack([loss, accuracy, seen])

    def _train_clients(self, weights: list[Any], x: Any, y: Any, examples: Any, participants: Any, clip: Any) -> Any:
        """Trains the round's clients, lane ``j`` taking clients ``j, j + lanes, ...`` in its own
        loop; the accumulators of all lanes summed: ``(update sum (flat), every client's update as
        a row ``[clients, d]`` (for the robust rules and compression; else ``[clients, 0]``),
        [weight sum, loss sum, correct sum, examples])``."""
        import tensorflow as tf

        count, lanes, d = tf.shape(x)[0], len(self._lanes), sum(self._sizes)
        keep_rows = self.statistic is not None or self.compress is not None
        summed = self.dp_clip is not None or not keep_rows  # else the loops carry no running sum
        flat_weights = _flatten(weights)

        def client(lane: tuple[Any, list[Any]], j: int, i: Any, acc: Any) -> Any:
            update_sum, rows, sums = acc
            k = j + i * lanes
            update, sums_k = self._client_update(lane, weights, flat_weights, x[k], y[k], examples[k])
            finite = tf.reduce_all(tf.math.is_finite(update))
            n_k = tf.cast(examples[k], tf.float32)
            weight = tf.where(finite, n_k, 0.0)
            update = tf.where(finite, update, tf.zeros_like(update))
            if self.dp_clip is not None:
                (update,), norm = tf.clip_by_global_norm([update], clip)
                update_sum = update_sum + update
                # Summed: TFF's count of unclipped updates (padding slots past the participants left out).
                weight = tf.where(k < participants, tf.cast(norm <= clip, tf.float32) - 0.5, 0.0)
            elif not keep_rows:
                update_sum = update_sum + weight * update
            else:  # kept for the robust rule, or compressed after the loops: all clients' rows of a tensor at once
                rows = rows.write(i, update if self.compress is None else update * weight)
            return update_sum, rows, sums + tf.stack([weight, sums_k[0], sums_k[1], n_k])

        update_sum, rows, sums = tf.zeros_like(flat_weights), [], []
        for j, lane in enumerate(self._lanes):  # independent loops: TensorFlow runs them side by side
            if not self.local_steps:  # (FedSGD's clients all compute at the server weights)
                for v, w in zip(lane[1], weights):
                    v.assign(w)
            n = (count - j + lanes - 1) // lanes
            lane_rows = tf.TensorArray(tf.float32, size=n, element_shape=[d]) if keep_rows else tf.zeros([0])
            lane_sum, lane_rows, lane_sums = _fori(n, functools.partial(client, lane, j),
                                                   (tf.zeros_like(flat_weights) if summed else (), lane_rows,
                                                    tf.zeros([4])))
            sums.append(lane_sums)
            if summed:
                update_sum += lane_sum
            if keep_rows:  # the lane's rows into their clients' slots
                rows.append(tf.scatter_nd(tf.range(j, count, lanes)[:, None], lane_rows.stack(), [self.clients_per_round, d]))
        rows = tf.add_n(rows) if keep_rows else tf.zeros([self.clients_per_round, 0])
        if self.compress is not None:  # (a slot without a participant holds zeros, which stay zeros)
            update_sum = tf.reduce_sum(tf.concat([self.compress(t) for t in tf.split(rows, self._sizes, axis=1)], 1), 0)
        return update_sum, rows, tf.add_n(sums)

    def _aggregate_round(self, weights: list[Any], server_state: Any, x: Any, y: Any, examples: Any,
                         participants: Any, round_num: Any, clip: Any) -> Any:
        import tensorflow as tf

        update_sum, rows, sums = self._train_clients(weights, x, y, examples, participants, clip)
        weight_sum, loss_sum, correct_sum, seen = tf.unstack(sums)
        if self.dp_clip is not None:
            mean_update = dp_noised_mean(self._unflatten(update_sum), clip * self.dp_noise, self.clients_per_round, self.noise_seed,
                                         round_num)
            if self.dp_adaptive is not None:
                clip = adapted_clip(clip, weight_sum, self.dp_adaptive, self.clients_per_round,
                                    self.noise_seed, round_num)
        elif self.statistic is None:
            mean_update = self._unflatten(update_sum / tf.maximum(weight_sum, 1e-30))
        else:
            mean_update = self._unflatten(self.statistic(rows[:participants]))
        new_state, new_weights = self.server_optimizer.next(server_state, tuple(weights), tuple(mean_update))
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(w)) for w in new_weights])
        new_weights = [tf.where(finite, n, w) for n, w in zip(new_weights, weights)]
        return new_weights, new_state, loss_sum / seen, correct_sum / seen, seen, clip

    def next(self, clients: Sequence[tuple[np.ndarray, np.ndarray]], round_num: int = 0) -> dict[str, float]:
        """Runs round ``round_num`` over ``clients`` (each ``(x, y)`` in training order); returns train metrics."""
        x, y, examples = self.pack(clients)
        if self._round is None:
            self._round = self._trace(x, y)
        loss, accuracy, seen = self._round(x, y, examples, np.int32(len(clients)), np.int64(round_num)).numpy().tolist()
        return {"train_loss": loss, "train_accuracy": accuracy, "num_examples": int(seen)}

    def _trace(self, x: np.ndarray, y: np.ndarray) -> Any:
        """The round as a concrete function for arrays shaped as ``x`` and ``y``: traced once,
        without AutoGraph (the round's loops are explicit; converting the model's and the
        optimizers' code costs seconds of start-up), or with it for a model that needs it."""
        import tensorflow as tf

        signature = [tf.TensorSpec(x.shape, x.dtype), tf.TensorSpec(y.shape, y.dtype),
                     tf.TensorSpec(x.shape[:1], tf.int32),
                     tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64)]
        try:
            return tf.function(self._round_impl, autograph=False).get_concrete_function(*signature)
        except tf.errors.OperatorNotAllowedInGraphError:  # Python control flow on tensors in the model
            return tf.function(self._round_impl, autograph=True).get_concrete_function(*signature)

    def get_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self._weight_vars]

    def assign_weights_to(self, model: Any) -> None:
        """Sets ``model``'s trainable weights (a model of ``model_fn``) to the server's, in one traced call."""
        import tensorflow as tf

        if self._copy is None or self._copy[0] is not model:
            pairs = list(zip(model.trainable_variables, self._weight_vars))

            def copy() -> None:
                for target, value in pairs:
                    target.assign(value)
            self._copy = (model, tf.function(copy, autograph=False))
        self._copy[1]()

    def state_leaves(self) -> list[np.ndarray]:
        """Weights, server optimizer state flattened, and the adaptive clip (for checkpoints)."""
        import tensorflow as tf

        clip = [self._clip_var.numpy()] if self.dp_adaptive is not None else []
        return self.get_weights() + [v.numpy() for v in tf.nest.flatten(self._state_vars)] + clip

    def load_leaves(self, leaves: Sequence[np.ndarray]) -> None:
        import tensorflow as tf

        n = len(self._weight_vars)
        flat_state = tf.nest.flatten(self._state_vars)
        if self.dp_adaptive is not None and len(leaves) > n + len(flat_state):
            clip, leaves = leaves[-1], leaves[:-1]
        else:
            clip = None
        if len(leaves) != n + len(flat_state):
            raise ValueError(f"A checkpoint of this backend holds {n + len(flat_state)} tensors. Received: {len(leaves)}")
        targets = [*self._weight_vars, *flat_state]
        expected = [tuple(v.shape) for v in targets]
        if [tuple(np.shape(v)) for v in leaves] != expected:
            raise ValueError(f"A checkpoint's tensor shapes do not match this model's {expected[:6]}... (another model?).")
        for var, value in zip(targets, leaves):
            var.assign(np.asarray(value, dtype=var.dtype.as_numpy_dtype))
        if clip is not None:
            self._clip_var.assign(float(clip))


def build_engine(config: Any, model_fn: Callable[[], Any], model: Any, max_examples: int) -> CompiledFedAvg:
    """The engine for a :class:`~tensorfleet.federated.config.SimulationConfig`, training in
    ``model`` (``model_fn()`` made eagerly) from its weights: TFF's ``initialize`` makes the same
    model from the same initializers, so no TFF process is built for them."""
    import tensorflow as tf

    from tensorfleet.federated import tff_model
    from tensorfleet.federated.algorithms import make_optimizer

    initial = _INITIAL_WEIGHTS.setdefault(model, [np.asarray(w) for w in model.trainable_weights])
    loss, _ = tff_model.loss_and_metrics(model)
    local_steps = config.algorithm != "fedsgd"
    with tf.init_scope():
        return CompiledFedAvg(model_fn=model_fn, loss_fn=loss,
                              client_optimizer=make_optimizer(config.client_opt) if local_steps else None,
                              server_optimizer=make_optimizer(config.server_opt),
                              initial_weights=initial,
                              batch_size=config.batch_size, max_examples=max_examples * config.local_epochs,
                              clients_per_round=config.clients_per_round,
                              mu=config.hyperparameters.get("mu", 0.0) if config.algorithm == "fedprox" else 0.0,
                              local_steps=local_steps, noise_seed=config.seed, model=model,
                              **aggregation(config.aggregator_name, config.clients_per_round,
                                            config.aggregator_options))


def _flatten(tensors: Sequence[Any]) -> Any:
    """Tensors as one flat vector (in order)."""
    import tensorflow as tf

    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def _fori(n: Any, body: Callable[[Any, Any], Any], init: Any) -> Any:
    """``for i in range(n): acc = body(i, acc)`` as a tf.while_loop."""
    import tensorflow as tf

    def cond(i: Any, acc: Any) -> Any:
        return i < n

    def loop(i: Any, acc: Any) -> Any:
        return i + 1, body(i, acc)

    return tf.while_loop(cond, loop, (tf.constant(0), init))[1]
