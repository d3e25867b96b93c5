"""Making a model small enough: QAT, magnitude pruning, weight clustering, low-rank decomposition,
distillation, freezing.

Quantization-aware training, pruning and clustering are tensorflow-model-optimization's (``tfmot``) for a
tf_keras model, and :mod:`tensorfleet.edge.keras3_optimize`'s for a Keras 3 one: Jacob et al., "Quantization and
Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference", CVPR 2018; Zhu & Gupta, "To prune, or not
to prune", 2017; Han et al., "Deep Compression", ICLR 2016. Distillation follows Hinton et al.,
"Distilling the Knowledge in a Neural Network", 2015: the student minimises
``alpha * CE(y, s) + (1 - alpha) * T^2 * KL(softmax(t / T) || softmax(s / T))``.

Each technique is one entry of :data:`TECHNIQUES`; :func:`finetune` fine-tunes a model with one
and returns a plain Keras model ready for :func:`tensorfleet.edge.convert` (pruning and
clustering wrappers stripped; a QAT model keeps its fake-quant ranges, which the int8
conversion uses).

Example:
    >>> pruned = finetune(model, "prune", x_train, y_train, sparsity=0.5, epochs=2)   # doctest: +SKIP
    >>> weight_sparsity(pruned)                                                       # doctest: +SKIP
    0.5
    >>> artifact = tensorfleet.edge.convert(pruned, "int8", representative_data=x_train)  # doctest: +SKIP

Which route runs follows the model's Keras (:func:`tensorfleet.compat.keras.keras_of`), never a fallback: tfmot
wraps tf_keras models only, so a Keras 3 model goes through :mod:`tensorfleet.edge.keras3_optimize` (the same
techniques and options; what it cannot take is one ``UnsupportedLayerError``). Distillation and freezing take
either Keras.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

import numpy as np

from tensorfleet.compat.keras import Keras, keras_of, module_of
from tensorfleet.compat.tfmot import import_tfmot
from tensorfleet.registry import Registry
from tensorfleet.validation import boolean, integer, number, positive_int

__all__ = ["Technique", "TECHNIQUES", "finetune", "apply_qat", "apply_pruning", "apply_clustering",
           "apply_decomposition", "strip_wrappers", "weight_sparsity", "unique_weights", "distill", "freeze_layers"]


class Technique(str, Enum):
    """The fine-tuning techniques :func:`finetune` accepts."""

    QAT = "qat"
    PRUNE = "prune"
    CLUSTER = "cluster"
    DECOMPOSE = "decompose"


@dataclass(frozen=True)
class _TechniqueSpec:
    wrap: Callable[..., Any]
    callbacks: Callable[[Any], list[Any]]


def _keras3(model: Any, where: str) -> bool:
    """Whether ``model`` takes the Keras 3 route (else tfmot's); a TypeError for what is no Keras model."""
    return keras_of(model, where) is Keras.KERAS3


def apply_qat(model: Any) -> Any:
    """Wraps ``model`` for quantization-aware training: tfmot ``quantize_model`` for a tf_keras model, fake
    quantization with folded BatchNorm (:func:`tensorfleet.edge.keras3_optimize.apply_qat`) for a Keras 3 one."""
    if _keras3(model, "tfl.edge.apply_qat"):
        from tensorfleet.edge import keras3_optimize

        return keras3_optimize.apply_qat(model)
    tfmot = import_tfmot()

    return tfmot.quantization.keras.quantize_model(model)


def apply_pruning(model: Any, *, sparsity: float = 0.5, begin_step: int = 0, frequency: int = 10,
                  schedule: str = "constant", initial_sparsity: float = 0.0, end_step: int | None = None,
                  power: float = 3.0) -> Any:
    """Wraps ``model`` for magnitude pruning: to a constant ``sparsity`` (fraction of zero weights) from
    ``begin_step`` on, or with ``schedule="polynomial"`` from ``initial_sparsity`` at ``begin_step`` to
    ``sparsity`` at ``end_step`` (``power`` 3 as Zhu & Gupta); masks recomputed every ``frequency`` steps.

    tfmot's wrappers for a tf_keras model, :mod:`tensorfleet.edge.keras3_optimize`'s for a Keras 3 one (the same
    schedules, the same count of zeros: ``n - round(n * (1 - sparsity))`` per kernel)."""
    from tensorfleet.edge import keras3_optimize

    plan = keras3_optimize.schedule_of(sparsity=sparsity, schedule=schedule, begin_step=begin_step,
                                       frequency=frequency, initial_sparsity=initial_sparsity, end_step=end_step,
                                       power=power)
    if _keras3(model, "tfl.edge.apply_pruning"):
        return keras3_optimize.apply_pruning(model, plan)
    tfmot = import_tfmot()

    if isinstance(plan, keras3_optimize.PolynomialDecay):
        tfmot_schedule = tfmot.sparsity.keras.PolynomialDecay(plan.initial_sparsity, plan.final_sparsity,
                                                              plan.begin_step, plan.end_step, plan.power,
                                                              plan.frequency)
    else:
        tfmot_schedule = tfmot.sparsity.keras.ConstantSparsity(plan.sparsity, begin_step=begin_step,
                                                               frequency=frequency)
    return tfmot.sparsity.keras.prune_low_magnitude(model, pruning_schedule=tfmot_schedule)


def apply_clustering(model: Any, *, clusters: int = 16) -> Any:
    """Wraps ``model`` for weight clustering: each kernel shares ``clusters`` values (k-means++ centroids;
    tfmot's wrappers for a tf_keras model, :mod:`tensorfleet.edge.keras3_optimize`'s for a Keras 3 one)."""
    integer("clusters", clusters, minimum=2)
    if _keras3(model, "tfl.edge.apply_clustering"):
        from tensorfleet.edge import keras3_optimize

        return keras3_optimize.apply_clustering(model, clusters)
    tfmot = import_tfmot()

    init = tfmot.clustering.keras.CentroidInitialization.KMEANS_PLUS_PLUS
    return tfmot.clustering.keras.cluster_weights(model, number_of_clusters=clusters, cluster_centroids_init=init)


def apply_decomposition(model: Any, **options: Any) -> Any:
    """The model with low-rank factors (:func:`tensorfleet.edge.decompose`; ``method=``, ``rank=`` or ``energy=``)."""
    from tensorfleet.edge.decompose import decompose

    return decompose(model, **options)


def _pruning_callbacks(model: Any) -> list[Any]:
    if _keras3(model, "tfl.edge.finetune"):
        from tensorfleet.edge.keras3_optimize import pruning_callbacks

        return pruning_callbacks(model)
    tfmot = import_tfmot()

    return [tfmot.sparsity.keras.UpdatePruningStep()]


TECHNIQUES: Registry[_TechniqueSpec] = Registry("optimization technique")
TECHNIQUES.register("qat", _TechniqueSpec(apply_qat, lambda model: []), aliases=("quantization_aware",),
                    description="Quantization-aware training: fake-quant int8 in the forward pass, BatchNorm folded.")
TECHNIQUES.register("prune", _TechniqueSpec(apply_pruning, _pruning_callbacks), aliases=("pruning",),
                    description="Magnitude pruning on a constant or polynomial schedule; wrappers stripped afterwards.")
TECHNIQUES.register("cluster", _TechniqueSpec(apply_clustering, lambda model: []), aliases=("clustering",),
                    description="Weight clustering: each kernel keeps only N distinct values (k-means centroids).")
TECHNIQUES.register("decompose", _TechniqueSpec(apply_decomposition, lambda model: []),
                    aliases=("decomposition", "low_rank"),
                    description="Low-rank factors of Dense and Conv2D layers (SVD, Tucker-2, CP), then fine-tuning.")


def strip_wrappers(model: Any) -> Any:
    """Removes pruning and clustering wrappers (a no-op for other models), of either Keras."""
    names = {type(layer).__name__ for layer in model.layers}
    if not names & {"PruneLowMagnitude", "ClusterWeights"}:
        return model
    if _keras3(model, "tfl.edge.strip_wrappers"):
        from tensorfleet.edge.keras3_optimize import strip

        return strip(model)
    tfmot = import_tfmot()

    names = {type(layer).__name__ for layer in model.layers}
    if "PruneLowMagnitude" in names:
        model = tfmot.sparsity.keras.strip_pruning(model)
    if "ClusterWeights" in names:
        model = tfmot.clustering.keras.strip_clustering(model)
    return model


def _kernels(model: Any) -> list[np.ndarray]:
    out = []
    for layer in model.layers:
        for name in ("kernel", "depthwise_kernel"):
            weight = getattr(layer, name, None)
            if weight is not None:
                out.append(np.asarray(weight.numpy()))
    return out


def weight_sparsity(model: Any) -> float:
    """Fraction of exactly-zero entries over all kernels (biases excluded)."""
    kernels = _kernels(model)
    total = sum(k.size for k in kernels)
    return float(sum(int(np.count_nonzero(k == 0)) for k in kernels) / total) if total else 0.0


def unique_weights(model: Any) -> list[int]:
    """Distinct values per kernel, layer by layer."""
    return [int(np.unique(k).size) for k in _kernels(model)]


def finetune(model: Any, technique: str | Technique, x: Any, y: Any, *, epochs: int = 1, batch_size: int = 32,
             loss: Any = None, optimizer: Any = "adam", validation_data: Any = None, verbose: int = 0,
             shuffle: bool = True, **options: Any) -> Any:
    """Fine-tunes ``model`` with one technique and returns a model ready for conversion.

    Args:
        model: a functional or Sequential model of either Keras (trained, usually): tfmot fine-tunes a tf_keras
            model, :mod:`tensorfleet.edge.keras3_optimize` a Keras 3 one.
        technique: ``qat``, ``prune``, ``cluster`` or ``decompose``.
        x, y: fine-tuning data.
        shuffle: shuffle ``x`` each epoch (``fit``'s option; False to feed both Kerases the same batches).
        loss: defaults to sparse categorical cross-entropy from logits (or from probabilities when
            the last layer is a softmax).
        options: ``sparsity=``, ``frequency=``, ``begin_step=``, ``schedule=`` (``"constant"`` or
            ``"polynomial"`` with ``initial_sparsity=``, ``end_step=``, ``power=``) for prune, ``clusters=`` for
            cluster; ``method=`` and ``rank=`` or ``energy=`` for decompose (see :func:`tensorfleet.edge.decompose`).

    Example:
        >>> qat = finetune(model, "qat", x_train, y_train, epochs=1)                       # doctest: +SKIP
        >>> tensorfleet.edge.convert(qat, "int8", representative_data=x_train)            # doctest: +SKIP
    """
    keras = module_of(model, "tfl.edge.finetune")
    name = TECHNIQUES.canonical(technique.value if isinstance(technique, Technique) else technique)
    positive_int("epochs", epochs)
    spec = TECHNIQUES.get(name)

    wrapped = spec.wrap(model, **options)
    if loss is None:
        softmax_out = getattr(model.layers[-1], "activation", None) is keras.activations.softmax
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax_out)
    wrapped.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
    wrapped.fit(x, y, epochs=epochs, batch_size=batch_size, validation_data=validation_data, verbose=verbose,
                shuffle=boolean("shuffle", shuffle), callbacks=spec.callbacks(wrapped))
    return strip_wrappers(wrapped) if name in ("prune", "cluster") else wrapped


def distill(teacher: Any, student: Any, x: Any, y: Any, *, temperature: float = 4.0, alpha: float = 0.1,
            epochs: int = 5, batch_size: int = 32, learning_rate: float = 1e-3, from_logits: bool = True,
            seed: int = 0) -> list[float]:
    """Trains ``student`` to match ``teacher``'s softened outputs and the labels (Hinton et al., 2015).

    Both models must output logits (or probabilities with ``from_logits=False``) over the same
    classes. The student is trained in place; the teacher is not changed. Either may be Keras 3 or tf_keras
    (the teacher only predicts; the student trains with its own Keras's optimizer).

    Returns:
        The mean training loss per epoch.

    Example:
        >>> small = tensorfleet.models.build("digits_cnn", filters=4)        # doctest: +SKIP
        >>> losses = distill(big, small, x_train, y_train, epochs=5)          # doctest: +SKIP
    """
    keras_of(teacher, "tfl.edge.distill")
    keras = module_of(student, "tfl.edge.distill")
    number("temperature", temperature, above=0)
    number("alpha", alpha, minimum=0, below=1)
    positive_int("epochs", epochs)
    if teacher.output_shape != student.output_shape:
        raise ValueError(f"teacher and student must have the same output shape. Received: "
                         f"teacher={teacher.output_shape}, student={student.output_shape}")
    import tensorflow as tf
    from tqdm.auto import trange

    x = np.asarray(x, np.float32)
    y = np.asarray(y)
    soft_targets = teacher.predict(x, batch_size=256, verbose=0)
    if not from_logits:
        soft_targets = np.log(np.clip(soft_targets, 1e-8, 1.0))
    optimizer = keras.optimizers.Adam(learning_rate)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    t = float(temperature)

    @tf.function
    def step(xb: Any, yb: Any, tb: Any) -> Any:
        with tf.GradientTape() as tape:
            out = student(xb, training=True)
            logits = out if from_logits else tf.math.log(tf.clip_by_value(out, 1e-8, 1.0))
            hard = ce(yb, logits)
            p_teacher = tf.nn.softmax(tb / t)
            soft = tf.reduce_mean(tf.reduce_sum(
                p_teacher * (tf.math.log(p_teacher + 1e-8) - tf.nn.log_softmax(logits / t)), axis=-1))
            loss = alpha * hard + (1.0 - alpha) * t * t * soft
        grads = tape.gradient(loss, student.trainable_variables)
        optimizer.apply_gradients(zip(grads, student.trainable_variables))
        return loss

    rng = np.random.default_rng(seed)
    history = []
    for _ in trange(epochs, desc="distilling", unit="epoch", leave=False):
        order = rng.permutation(len(x))
        losses = [float(step(x[idx], y[idx], soft_targets[idx]))
                  for idx in (order[i:i + batch_size] for i in range(0, len(x), batch_size))]
        history.append(float(np.mean(losses)))
    return history


def freeze_layers(model: Any, *, first: int | None = None, names: list[str] | None = None) -> list[str]:
    """Sets ``trainable=False`` on the first ``first`` weighted layers, or on the layers named.

    Recompile the model afterwards for the change to take effect in ``fit``.

    Returns:
        The names of the layers frozen.

    Example:
        >>> freeze_layers(model, first=2)     # doctest: +SKIP
        ['conv2d', 'conv2d_1']
    """
    keras_of(model, "tfl.edge.freeze_layers")
    if (first is None) == (names is None):
        raise ValueError("Pass exactly one of first= or names=.")
    weighted = [layer for layer in model.layers if layer.weights]
    if first is not None:
        if isinstance(first, bool) or not isinstance(first, int) or not 0 < first <= len(weighted):
            raise ValueError(f"first must be between 1 and the {len(weighted)} layers with weights. "
                             f"Received: first={first!r}")
        chosen = weighted[:first]
    else:
        by_name = {layer.name: layer for layer in model.layers}
        unknown = [n for n in names or [] if n not in by_name]
        if unknown:
            raise ValueError(f"Unknown layer name(s) {unknown}. Available: {', '.join(by_name)}")
        chosen = [by_name[n] for n in names or []]
    for layer in chosen:
        layer.trainable = False
    return [layer.name for layer in chosen]
