"""The ``compiled`` backend: a whole FedAvg-family, FedProx or FedSGD round as one TensorFlow function, outside TFF.

Where the time of a TFF simulation goes, measured on this stack (bench/federated_speed.py):
every round builds one ``tf.data`` dataset per client, TFF serializes them (with their data) to
its C++ worker over gRPC, the worker runs the round, and the result comes back as Python values.
With small models nearly all of it is that per-round traffic and per-client Python, not the
arithmetic.

This backend runs the same arithmetic as TFF's ``build_weighted_fed_avg`` (TFF's model-delta
client work and apply-optimizer finalizer) in one ``tf.function`` traced once: the sampled
clients' examples come as one padded batch ``[clients, steps * batch, ...]`` with a mask, a
``tf.while_loop`` trains each client from the server weights with the client optimizer (the same
``tff.learning.optimizers`` object), the deltas ``initial - trained`` are averaged weighted by
examples (a client with a non-finite delta gets weight 0, as in TFF), and the server optimizer
(again TFF's) applies the mean delta. FedProx adds TFF 0.87's proximal term to every local
gradient: ``mu * (w_server - w)`` (TFF's sign, the opposite of the paper's ``mu * (w - w_server)``;
kept so that both backends give the same model). FedSGD takes no local steps: a client's update
is its batch gradients at the server weights averaged weighted by batch size (TFF's
``build_fed_sgd``). The initial weights are ``model_fn()``'s, made eagerly: TFF's ``initialize``
makes the same model from the same initializers, so no TFF process, worker or tracing is needed
before the first round, and federated evaluation runs in this process too
(:func:`evaluate_batches`). ``tests/federated/backends/test_compiled.py`` checks that both
backends give the same model and metrics after the same rounds.

Supported: ``fedsgd``, ``fedprox`` and the algorithms built on weighted FedAvg (``fedavg``,
``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``) with the aggregators of
:data:`COMPILED_AGGREGATORS` (the mean; DP with fixed or adaptive clipping, TFF's clipping, noise
and clip-update rules with the noise drawn statelessly from the seed and the round; compression;
median, trimmed mean, Krum), client dropout and stragglers, on ``partition()`` client data,
and models without batch-dependent layers. Padded rows pass through the model (masked out of
the loss only), so a layer whose output for a row depends on the other rows would see them:
BatchNormalization and its variants are refused by class (their batch statistics would take in
the padding, and their moving statistics are not trained here), and any other layer by a probe
(:func:`batch_dependent_layers`) before the first round. ``backend="auto"`` runs such models on TFF.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["COMPILED_AGGREGATORS", "ROBUST_AGGREGATORS", "SUPPORTED_ALGORITHMS", "CompiledFedAvg", "aggregation",
           "batch_dependent_layers", "build_engine", "compiled_refusal", "dp_noised_mean", "adapted_clip", "evaluate_batches", "unsupported"]

SUPPORTED_ALGORITHMS = ("fedavg", "fedsgd", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
# Aggregators compiled runs besides the mean (None): unweighted rules over the stacked updates.
ROBUST_AGGREGATORS = ("median", "trimmed_mean", "krum")
COMPILED_AGGREGATORS = (None, "mean", "dp_fixed", "dp_adaptive", "compression", *ROBUST_AGGREGATORS)
# Layer classes (and their subclasses, found by name in the MRO) that normalize over the batch.
BATCH_NORMALIZATION_CLASSES = ("BatchNormalizationBase", "BatchNormalization", "SyncBatchNormalization")


def unsupported(received: str) -> ValueError:
    """The error for a simulation this backend does not run; ``received`` names what was asked."""
    return ValueError(f"backend='compiled' runs {', '.join(SUPPORTED_ALGORITHMS)} with the "
                      f"{', '.join(a for a in COMPILED_AGGREGATORS if a)} aggregators on partition() client data. Received: {received}")


def batch_dependent_layers(model: Any, rows: np.ndarray) -> list[str]:
    """What in ``model`` makes a row's output depend on the other rows of its batch.

    BatchNormalization and its subclasses are named by class (anywhere in nested models); a
    model without them is probed in inference mode: its output for ``rows`` (a few real inputs)
    alone and with as many zero rows appended (as this backend pads) must agree. A custom layer
    that mixes rows only when training is not seen by the probe.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)),
        ...                              tf.keras.layers.BatchNormalization(name="bn")])
        >>> batch_dependent_layers(model, np.ones((2, 3), np.float32))
        ["BatchNormalization 'bn'"]
    """
    found = [f"{type(layer).__name__} {layer.name!r}" for layer in model.submodules
             if any(k.__name__ in BATCH_NORMALIZATION_CLASSES for k in type(layer).__mro__)]
    if found:
        return found
    rows = np.asarray(rows)
    alone = np.asarray(model(rows, training=False))
    padded = np.asarray(model(np.concatenate([rows, np.zeros_like(rows)]), training=False))[:len(rows)]
    if not np.allclose(alone, padded, rtol=1e-4, atol=1e-5):
        return ["a layer of the model (its output for a row changes when zero rows join the batch)"]
    return []


def compiled_refusal(clients: Any, model: Any = None) -> str | None:
    """Why this backend cannot give TFF's result for ``clients`` (and ``model``), or None when it can."""
    if not hasattr(clients, "indices"):
        return f"clients={type(clients).__name__}"
    if model is None:
        return None
    found = batch_dependent_layers(model, clients.arrays(clients.client_ids[0])[0][:4])
    if found:
        return (f"a model with batch-dependent layers ({', '.join(found)}): the padded rows of a round would enter "
                f"their batch statistics and the result would differ from TFF's; backend='tff' or 'auto' runs it")
    return None


class CompiledFedAvg:
    """FedAvg-family rounds as one compiled TensorFlow function.

    Args:
        model_fn: returns the (uncompiled) Keras model.
        loss_fn: per-example loss ``loss_fn(y, logits) -> [batch]`` (reduction NONE).
        client_optimizer: a ``tff.learning.optimizers.Optimizer`` for local steps.
        server_optimizer: a ``tff.learning.optimizers.Optimizer`` for the mean delta.
        initial_weights: trainable weights to start from (TFF's initial model).
        batch_size: local batch size.
        max_examples: the most examples (times local epochs) any client trains on in a round.
        clients_per_round: the padded number of clients per round.
        mu: FedProx's proximal strength: ``mu * (w_server - w)`` joins every local gradient, as in
            TFF 0.87's ``build_weighted_fed_prox`` (0: FedAvg).
        local_steps: False for FedSGD (TFF's ``build_fed_sgd``): a client takes no steps; its
            update is its batch gradients averaged weighted by batch size, at the server weights.
        statistic: None for the example-weighted mean; else an unweighted rule (such as
            :meth:`~tensorfleet.federated.aggregators.robust.RobustFactory.statistic`) applied to
            the round's flattened updates stacked ``[participants, d]``, as TFF's unweighted
            algorithms apply it (a non-finite update enters as zeros).
        compress: None, or what is applied to every tensor of ``examples * update`` before the
            sum of TFF's ``MeanFactory(value_sum_factory=CompressionFactory)`` (the ``compression``
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
    """

    def __init__(self, *, model_fn: Callable[[], Any], loss_fn: Any, client_optimizer: Any, server_optimizer: Any,
                 initial_weights: Sequence[np.ndarray], batch_size: int, max_examples: int,
                 clients_per_round: int, mu: float = 0.0, local_steps: bool = True,
                 statistic: Callable[[Any], Any] | None = None, compress: Callable[[Any], Any] | None = None,
                 dp_clip: float | None = None, dp_noise: float = 0.0,
                 dp_adaptive: tuple[float, float, float] | None = None, noise_seed: int = 0) -> None:
        import tensorflow as tf

        self.model = model_fn()
        self.variables = list(self.model.trainable_variables)
        if len(self.variables) != len(initial_weights):
            raise ValueError(f"initial_weights has {len(initial_weights)} tensors; the model has {len(self.variables)}.")
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
        self.clip = tf.constant(float(dp_clip or 0.0), tf.float32)  # the current clip (adaptive: state)
        specs = [tf.TensorSpec(v.shape, v.dtype) for v in self.variables]
        self.weights = [tf.constant(w, dtype=v.dtype) for w, v in zip(initial_weights, self.variables)]
        # Tensors from the start, so the compiled round is traced once (not again on round 2).
        self.server_state = tf.nest.map_structure(tf.convert_to_tensor, server_optimizer.initialize(tuple(specs)))
        self._specs = specs
        self._round = tf.function(self._round_impl, reduce_retracing=True)

    # The padded client batch: x [K, L, ...], y [K, L], mask [K, L], examples [K].
    def pack(self, clients: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
        """Pads the clients' (already ordered) examples into the round's arrays."""
        if len(clients) > self.clients_per_round:
            raise ValueError(f"At most {self.clients_per_round} clients per round. Received: {len(clients)}")
        x0, y0 = clients[0]
        x = np.zeros((self.clients_per_round, self.length, *x0.shape[1:]), dtype=x0.dtype)
        y = np.zeros((self.clients_per_round, self.length), dtype=y0.dtype)
        mask = np.zeros((self.clients_per_round, self.length), dtype=np.float32)
        examples = np.zeros((self.clients_per_round,), dtype=np.int32)
        for k, (xk, yk) in enumerate(clients):
            n = len(yk)
            if n > self.length:
                raise ValueError(f"A client has {n} examples; this backend was sized for {self.length}.")
            x[k, :n], y[k, :n], mask[k, :n], examples[k] = xk, yk, 1.0, n
        return x, y, mask, examples

    def _client_update(self, weights: list[Any], xk: Any, yk: Any, mk: Any, n: Any) -> tuple[Any, ...]:
        """One client's ``(update, loss sum, correct sum)``: the delta ``initial - trained`` after
        local steps, or (FedSGD) the example-weighted mean of its batch gradients."""
        import tensorflow as tf

        B = self.batch_size
        for v, w in zip(self.variables, weights):
            v.assign(w)
        opt_state = self.client_optimizer.initialize(tuple(self._specs)) if self.local_steps else ()
        grad_sum = [tf.zeros_like(w) for w in weights]

        def step(s: Any, carry: Any) -> Any:
            opt_state, grad_sum, loss_acc, correct_acc = carry
            xb, yb, mb = xk[s * B:(s + 1) * B], yk[s * B:(s + 1) * B], mk[s * B:(s + 1) * B]
            rows = tf.reduce_sum(mb)
            with tf.GradientTape() as tape:
                logits = self.model(xb, training=True)
                loss = tf.reduce_sum(self.loss_fn(yb, logits) * mb) / rows
            grads = tape.gradient(loss, self.variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            if self.local_steps:
                current = tuple(v.read_value() for v in self.variables)
                if self.mu > 0.0:
                    # TFF 0.87's sign (proximal_client_work): mu * (w_server - w).
                    grads = [g + self.mu * (w - c) for g, c, w in zip(grads, current, weights)]
                opt_state, updated = self.client_optimizer.next(opt_state, current, tuple(grads))
                for v, u in zip(self.variables, updated):
                    v.assign(u)
            else:
                grad_sum = [a + rows * g for a, g in zip(grad_sum, grads)]
            hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=yb.dtype), yb), tf.float32)
            return opt_state, grad_sum, loss_acc + loss * rows, correct_acc + tf.reduce_sum(hits * mb)

        zero = tf.constant(0.0)
        _, grad_sum, loss_k, correct_k = _fori((n + B - 1) // B, step, (opt_state, grad_sum, zero, zero))
        if self.local_steps:
            return [w - v.read_value() for w, v in zip(weights, self.variables)], loss_k, correct_k
        return [g / tf.cast(n, tf.float32) for g in grad_sum], loss_k, correct_k

    def _round_impl(self, weights: list[Any], server_state: Any, x: Any, y: Any, mask: Any, examples: Any,
                    participants: Any, round_num: Any, clip: Any) -> Any:
        import tensorflow as tf

        def client(k: Any, acc: Any) -> Any:
            update_sum, rows, weight_sum, loss_sum, correct_sum, seen = acc
            update, loss_k, correct_k = self._client_update(weights, x[k], y[k], mask[k], examples[k])
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in update])
            weight = tf.where(finite, tf.cast(examples[k], tf.float32), 0.0)
            update = [tf.where(finite, d, tf.zeros_like(d)) for d in update]
            if self.dp_clip is not None:
                update, norm = tf.clip_by_global_norm(update, clip)
                update_sum = [a + d for a, d in zip(update_sum, update)]
                # Summed: TFF's count of unclipped updates (padding slots past the participants left out).
                weight = tf.where(k < participants, tf.cast(norm <= clip, tf.float32) - 0.5, 0.0)
            elif self.compress is not None:
                update_sum = [a + self.compress(d * weight) for a, d in zip(update_sum, update)]
            elif self.statistic is None:
                update_sum = [a + weight * d for a, d in zip(update_sum, update)]
            else:
                flat = tf.concat([tf.reshape(d, [-1]) for d in update], axis=0)
                rows = tf.tensor_scatter_nd_update(rows, [[k]], flat[None])
            return (update_sum, rows, weight_sum + weight, loss_sum + loss_k, correct_sum + correct_k,
                    seen + tf.cast(examples[k], tf.float32))

        zero = tf.constant(0.0)
        sizes = [int(np.prod(w.shape)) for w in self._specs]
        rows = tf.zeros([self.clients_per_round, sum(sizes) if self.statistic is not None else 0])
        acc = ([tf.zeros_like(w) for w in weights], rows, zero, zero, zero, zero)
        update_sum, rows, weight_sum, loss_sum, correct_sum, seen = _fori(tf.shape(x)[0], client, acc)
        if self.dp_clip is not None:
            mean_update = dp_noised_mean(update_sum, clip * self.dp_noise, self.clients_per_round, self.noise_seed,
                                         round_num)
            if self.dp_adaptive is not None:
                clip = adapted_clip(clip, weight_sum, self.dp_adaptive, self.clients_per_round,
                                    self.noise_seed, round_num)
        elif self.statistic is None:
            mean_update = [d / tf.maximum(weight_sum, 1e-30) for d in update_sum]
        else:
            pieces = tf.split(self.statistic(rows[:participants]), sizes)
            mean_update = [tf.reshape(p, w.shape) for p, w in zip(pieces, self._specs)]
        new_state, new_weights = self.server_optimizer.next(server_state, tuple(weights), tuple(mean_update))
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(w)) for w in new_weights])
        new_weights = [tf.where(finite, n, w) for n, w in zip(new_weights, weights)]
        return new_weights, new_state, loss_sum / seen, correct_sum / seen, seen, clip

    def next(self, clients: Sequence[tuple[np.ndarray, np.ndarray]], round_num: int = 0) -> dict[str, float]:
        """Runs round ``round_num`` over ``clients`` (each ``(x, y)`` in training order); returns train metrics."""
        x, y, mask, examples = self.pack(clients)
        weights, state, loss, accuracy, seen, self.clip = self._round(
            self.weights, self.server_state, x, y, mask, examples, np.int32(len(clients)), np.int64(round_num), self.clip)
        self.weights, self.server_state = list(weights), state
        return {"train_loss": float(loss), "train_accuracy": float(accuracy), "num_examples": int(seen)}

    def get_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.weights]

    def state_leaves(self) -> list[np.ndarray]:
        """Weights, server optimizer state flattened, and the adaptive clip (for checkpoints)."""
        import tensorflow as tf

        clip = [np.asarray(self.clip)] if self.dp_adaptive is not None else []
        return [np.asarray(w) for w in self.weights] + [np.asarray(v) for v in tf.nest.flatten(self.server_state)] + clip

    def load_leaves(self, leaves: Sequence[np.ndarray]) -> None:
        import tensorflow as tf

        n = len(self.weights)
        if self.dp_adaptive is not None and len(leaves) > n:
            self.clip, leaves = tf.constant(leaves[-1], tf.float32), leaves[:-1]
        flat_state = tf.nest.flatten(self.server_state)
        if len(leaves) != n + len(flat_state):
            raise ValueError(f"A checkpoint of this backend holds {n + len(flat_state)} tensors. Received: {len(leaves)}")
        expected = [tuple(w.shape) for w in self.weights] + [tuple(np.shape(v)) for v in flat_state]
        if [tuple(np.shape(v)) for v in leaves] != expected:
            raise ValueError(f"A checkpoint's tensor shapes do not match this model's {expected[:6]}... (another model?).")
        self.weights = [tf.constant(v) for v in leaves[:n]]
        self.server_state = tf.nest.pack_sequence_as(self.server_state, [tf.constant(v) for v in leaves[n:]])


def build_engine(config: Any, model_fn: Callable[[], Any], model: Any, max_examples: int) -> CompiledFedAvg:
    """The engine for a :class:`~tensorfleet.federated.config.SimulationConfig`, starting from the
    weights of ``model`` (``model_fn()`` made eagerly: TFF's ``initialize`` makes the same model
    from the same initializers, so no TFF process is built for them)."""
    import tensorflow as tf

    from tensorfleet.federated import tff_model
    from tensorfleet.federated.algorithms import make_optimizer

    loss, _ = tff_model.loss_and_metrics(model)
    per_example = type(loss)(from_logits=loss.get_config()["from_logits"], reduction=tf.keras.losses.Reduction.NONE)
    local_steps = config.algorithm != "fedsgd"
    with tf.init_scope():
        return CompiledFedAvg(model_fn=model_fn, loss_fn=per_example,
                              client_optimizer=make_optimizer(config.client_opt) if local_steps else None,
                              server_optimizer=make_optimizer(config.server_opt),
                              initial_weights=[np.asarray(w) for w in model.trainable_weights],
                              batch_size=config.batch_size, max_examples=max_examples * config.local_epochs,
                              clients_per_round=config.clients_per_round,
                              mu=config.hyperparameters.get("mu", 0.0) if config.algorithm == "fedprox" else 0.0,
                              local_steps=local_steps, noise_seed=config.seed,
                              **aggregation(config.aggregator_name, config.clients_per_round,
                                            config.aggregator_options))


def aggregation(name: str | None, clients_per_round: int, options: dict[str, Any]) -> dict[str, Any]:
    """The :class:`CompiledFedAvg` arguments of aggregator ``name`` with ``options`` (checked as
    :func:`~tensorfleet.federated.aggregators.build_aggregator` checks them)."""
    if name in (None, "mean"):
        return {}
    from tensorfleet.federated.aggregators import AGGREGATORS, build_aggregator

    factory = build_aggregator(name, clients_per_round=clients_per_round, **options)
    if name in ROBUST_AGGREGATORS:
        return {"statistic": factory.statistic}
    given = {**{k: p.default for k, p in inspect.signature(AGGREGATORS.get(name)).parameters.items()
                if k != "clients_per_round"}, **options}
    if name == "dp_fixed":
        return {"dp_clip": float(given["clip"]), "dp_noise": float(given["noise_multiplier"])}
    if name == "dp_adaptive":
        noise = float(given["noise_multiplier"])
        count_stddev = 0.05 * clients_per_round if noise > 0 else 0.0  # TFF's adaptive_clip_noise_params
        value_noise = (noise ** -2 - (2 * count_stddev) ** -2) ** -0.5 if noise > 0 else 0.0
        return {"dp_clip": float(given["clip"]), "dp_noise": value_noise,
                "dp_adaptive": (float(given["target_quantile"]), float(given["clip_learning_rate"]), count_stddev)}
    from tensorfleet.federated.aggregators.compression import CompressionFactory

    return {"compress": CompressionFactory(bits=given["bits"], sparsity=given["sparsity"]).compress}


def dp_noised_mean(clipped_sum: Sequence[Any], stddev: float, denominator: int, seed: int, round_num: Any) -> list[Any]:
    """TFF's DP-FedAvg result from the clipped sum (``NormalizedQuery(GaussianSumQuery)``): every
    tensor plus Gaussian noise of ``stddev``, over ``denominator``. The noise is drawn statelessly
    from ``seed`` and ``round_num`` (so a resumed run draws what the uninterrupted one did)."""
    import tensorflow as tf

    round_num = tf.cast(round_num, tf.int64)
    out = []
    for i, total in enumerate(clipped_sum):
        key = tf.stack([tf.constant(seed, tf.int64), round_num * len(clipped_sum) + i])
        noise = tf.random.stateless_normal(tf.shape(total), key, stddev=stddev, dtype=total.dtype)
        out.append((total + noise) / float(denominator))
    return out


def adapted_clip(clip: Any, unclipped_sum: Any, adaptive: tuple[float, float, float], denominator: int, seed: int,
                 round_num: Any) -> Any:
    """The next clip of TFF's adaptive clipping (tensorflow_privacy's ``QuantileEstimatorQuery``,
    geometric update): ``unclipped_sum`` is the sum over clients of ``[norm <= clip] - 0.5``."""
    import tensorflow as tf

    target, learning_rate, count_stddev = adaptive
    key = tf.stack([tf.constant(seed, tf.int64), -1 - tf.cast(round_num, tf.int64)])
    noised = (unclipped_sum + tf.random.stateless_normal([], key, stddev=count_stddev)) / float(denominator)
    below = tf.minimum(1.0, tf.maximum(0.0, noised + 0.5))
    return tf.maximum(clip * tf.math.exp(-(learning_rate * (below - target))), 0.0)


def evaluate_batches(model: Any, datasets: Sequence[Any]) -> dict[str, float]:
    """TFF's federated evaluation (``build_fed_eval``) of ``model`` on the batched ``datasets`` of
    the evaluation clients, in this process: loss and accuracy over all their examples."""
    from tensorfleet.federated import tff_model

    loss_fn, _ = tff_model.loss_and_metrics(model)
    total_loss, correct, count = 0.0, 0, 0
    for dataset in datasets:
        for batch in dataset:
            logits = model(batch["x"], training=False)
            y = np.asarray(batch["y"])
            total_loss += float(loss_fn(y, logits)) * len(y)
            correct += int(np.sum(np.argmax(np.asarray(logits), axis=-1) == y))
            count += len(y)
    return {"fed_eval_loss": total_loss / max(count, 1), "fed_eval_accuracy": correct / max(count, 1)}


def _fori(n: Any, body: Callable[[Any, Any], Any], init: Any) -> Any:
    """``for i in range(n): acc = body(i, acc)`` as a tf.while_loop."""
    import tensorflow as tf

    def cond(i: Any, acc: Any) -> Any:
        return i < n

    def loop(i: Any, acc: Any) -> Any:
        return i + 1, body(i, acc)

    return tf.while_loop(cond, loop, (tf.constant(0), init))[1]
