"""The compiled backend's weights and federated evaluation as a simulation sees them, in this process:
:class:`ModelWeights` (what TFF's ``ModelWeights`` is on the tff backend) and :func:`evaluate_batches`
(TFF's ``build_fed_eval``), with the labels read one per example as TFF's tutorials shape them.

Example:
    >>> import numpy as np
    >>> one_label_per_example(np.array([[3], [1]])).tolist()
    [3, 1]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["ModelWeights", "evaluate_batches", "one_label_per_example"]


class ModelWeights:
    """The weights of a model as a simulation holds them (what TFF's ``ModelWeights`` is on the tff backend).

    Attributes:
        trainable: the trainable weights, in the model's order.
        non_trainable: the non-trainable weights (the compiled backend keeps none).
    """

    def __init__(self, trainable: Any, non_trainable: Any = ()) -> None:
        self.trainable = list(trainable)
        self.non_trainable = list(non_trainable)

    def assign_weights_to(self, model: Any) -> None:
        """Sets ``model``'s trainable (and, when held, non-trainable) weights to these."""
        for variable, value in zip(model.trainable_weights, self.trainable):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_weights, self.non_trainable):
            variable.assign(value)


def evaluate_batches(model: Any, datasets: Sequence[Any]) -> dict[str, float]:
    """TFF's federated evaluation (``build_fed_eval``) of ``model`` on the batched ``datasets`` of
    the evaluation clients, in this process: loss and accuracy over all their examples."""
    from tensorfleet.federated import tff_model

    loss_fn, _ = tff_model.loss_and_metrics(model)
    total_loss, correct, count = 0.0, 0, 0
    for dataset in datasets:
        for batch in dataset:
            logits = model(batch["x"], training=False)
            y = one_label_per_example(np.asarray(batch["y"]))
            total_loss += float(loss_fn(y, logits)) * len(y)
            correct += int(np.sum(np.argmax(np.asarray(logits), axis=-1) == y))
            count += len(y)
    return {"fed_eval_loss": total_loss / max(count, 1), "fed_eval_accuracy": correct / max(count, 1)}


def one_label_per_example(y: np.ndarray) -> np.ndarray:
    """Integer labels as one per example, ``(n,)``: labels shaped ``(n, 1)`` flattened; others as they are."""
    y = np.asarray(y)
    return y.reshape(len(y)) if y.ndim > 1 and y.size == len(y) else y
