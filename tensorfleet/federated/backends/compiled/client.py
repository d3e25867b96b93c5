"""One client's work in the compiled round: :func:`client_update`, the local steps (or FedSGD's
batch gradients) of the algorithm's client part on the batches TFF's dataset would give.

:class:`~tensorfleet.federated.backends.compiled.CompiledFedAvg` calls it inside each lane's loop,
in the lane's own copy of the model; it is traced once with the round.
"""

from __future__ import annotations

from typing import Any, Sequence

from tensorfleet.federated.backends.compiled.layout import flatten, fori

__all__ = ["add_non_trainable", "client_update"]


def client_update(work: Any, loss_fn: Any, batch_size: int, specs: Sequence[Any],
                  lane: tuple[Any, list[Any], list[Any]],
                  weights: list[Any], flat_weights: Any, xk: Any, yk: Any, n: Any) -> tuple[Any, Any, Any]:
    """One client's ``(update, [loss sum, correct sum], steps)``, the update flat: the delta
    ``initial - trained`` after local steps (divided by the steps under FedNova), or (FedSGD) the
    example-weighted mean of its batch gradients.

    ``work`` is the algorithm's client part, ``lane`` ``(model, trainable variables, non-trainable
    variables)`` to train in, ``weights`` the start (``flat_weights`` flattened), ``xk``/``yk`` the
    client's padded examples of which ``n`` are real.
    """
    import tensorflow as tf

    B = batch_size
    model, variables, _ = lane
    if work.local_steps:  # (FedSGD's clients all start where the round set the model)
        for v, w in zip(variables, weights):
            v.assign(w)
    opt_state = work.optimizer.initialize(tuple(specs)) if work.local_steps else ()
    # Only FedSGD sums gradients: no loop variables that a step does not change.
    grad_sum = () if work.local_steps else tf.zeros_like(flat_weights)

    def step(s: Any, carry: Any) -> Any:
        opt_state, grad_sum, sums = carry
        # The batch TFF's dataset would give: its real rows only, so no padding enters the model.
        end = tf.minimum((s + 1) * B, n)
        xb, yb = xk[s * B:end], yk[s * B:end]
        rows = tf.cast(end - s * B, tf.float32)
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits)
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        if work.local_steps:
            current = tuple(v.read_value() for v in variables)
            opt_state, updated = work.optimizer.next(opt_state, current, tuple(work.gradients(grads, current, weights)))
            for v, u in zip(variables, updated):
                v.assign(u)
        else:
            grad_sum = grad_sum + rows * flatten(grads)
        hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=yb.dtype), yb), tf.float32)
        return opt_state, grad_sum, sums + tf.stack([loss * rows, tf.reduce_sum(hits)])

    steps = (n + B - 1) // B
    _, grad_sum, sums = fori(steps, step, (opt_state, grad_sum, tf.zeros([2])))
    steps = tf.cast(steps, tf.float32)
    if not work.local_steps:
        return grad_sum / tf.cast(n, tf.float32), sums, steps
    update = flat_weights - flatten([v.read_value() for v in variables])
    return (update / tf.maximum(steps, 1.0) if work.normalized else update), sums, steps


def add_non_trainable(acc: dict[str, Any], lane: Any, i: Any, weight: Any, local: Any) -> dict[str, Any]:
    """``acc`` with client ``i``'s non-trainable weights (``lane[2]``) added, times ``weight``, to the weighted
    sum; with FedBN (``local``) its BN layers after its steps too, kept in ``acc["local"]`` and into the
    server's mean."""
    if local is not None:
        row = flatten([lane[1][t].read_value() for t in local.trainable] + [v.read_value() for v in lane[2]])
        acc["local"] = acc["local"].write(i, row)
    else:
        row = flatten([v.read_value() for v in lane[2]])
    acc["frozen"] = acc["frozen"] + weight * row
    return acc
