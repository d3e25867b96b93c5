"""Keras 3's TensorFlow trainer under ``MultiWorkerMirroredStrategy``: the mends tensorfleet installs.

Keras 3's ``fit`` fails in every worker of a multi-worker mirrored job (keras-team/keras#20585, open
at Keras 3.15.1). Two places of ``keras/src/backend/tensorflow/trainer.py`` break, found by mending one
at a time in a launched 2-worker job:

1. ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from a sample batch that it takes with
   ``strategy.reduce("MEAN", batch, axis=None)`` in eager mode; under the collective strategy that
   tries to turn a ``PerReplica`` into a tensor ("... PerReplica ... to a Tensor"), and under any
   strategy of several replicas it fails when the first batch does not split evenly over them (the
   replicas' parts differ in size: "Inputs to operation AddN ... must have the same size and shape").
   Building needs the shapes of one replica's batch only, so the mend takes
   ``strategy.experimental_local_results(v)[0]`` under every strategy of more than one replica.
2. ``reduce_per_replica`` reduces a step's logs with ``strategy.reduce("MEAN", v, axis=0)`` when the
   strategy is multi-worker: "Invalid reduction dimension 0 for input with 0 dimensions" for the scalar
   loss and metrics. One worker's path (``tf.reduce_mean`` of the stacked replica values, axis 0 of
   the stack) is the element-wise mean over replicas, which is ``strategy.reduce("MEAN", v,
   axis=None)`` across workers: the mend reduces every ``"mean"``/``"auto"`` value that way.

Checked on Keras 3.15.1 (TensorFlow 2.21): with both mends ``fit`` (with ``validation_data``),
``evaluate`` and ``predict`` (whose ``"concat"`` reduction, ``_multi_worker_concat``, works as it is)
run in 2 launched workers, which end with equal weights, equal to one process on the same global batch
within float32 tolerance. :func:`mend_fit` installs the mends (idempotent) and
:func:`restore_fit` takes them out; tensorfleet installs them when it builds a
``mirrored``, ``central_storage`` or ``multi_worker_mirrored`` strategy, never at import. On a Keras 3 version not
checked here nothing is changed and a warning says so.

Keras 3's callbacks that write files (``BackupAndRestore``, ``ModelCheckpoint``) are not made for several workers
either: :mod:`tensorfleet.compat.keras3_checkpoints` (whose ``ModelCheckpoint`` mend :func:`mend_fit` installs too).

Example:
    >>> from tensorfleet.compat import keras3
    >>> keras3.CHECKED_VERSIONS
    ('3.15',)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from typing import Any, Callable, Iterator

from tensorfleet.compat import keras3_checkpoints

__all__ = ["CHECKED_VERSIONS", "keras3_in_use", "mend_fit", "fit_mended",
           "restore_fit"]

log = logging.getLogger(__name__)

CHECKED_VERSIONS = ("3.15",)
"""Keras 3 releases (major.minor) whose TensorFlow trainer the mends were checked against."""

UPSTREAM_ISSUE = "keras-team/keras#20585"
_originals: dict[str, Any] = {}
"""What the mends replaced (``"_maybe_symbolic_build"``, ``"reduce_per_replica"``), while installed."""


def _trainer_module() -> Any:
    from keras.src.backend.tensorflow import trainer
    return trainer


def keras3_in_use() -> Any:
    """The ``keras`` package when it is Keras 3 on the TensorFlow backend and this process uses it (imported,
    or what ``tf.keras`` is); else None. A tf_keras user's process never imports Keras 3 because of this."""
    from importlib.metadata import PackageNotFoundError, version

    from tensorfleet.compat.keras import Keras, user_keras

    try:
        if int(version("keras").split(".")[0]) < 3:
            return None
    except (PackageNotFoundError, ValueError):
        return None
    if "keras" not in sys.modules and user_keras() is not Keras.KERAS3:
        return None
    try:
        import keras
    except ImportError:
        return None
    if keras.backend.backend() != "tensorflow":
        log.info("Keras %s runs on the %s backend, not TensorFlow's: no multi-worker mends apply.",
                 keras.__version__, keras.backend.backend())
        return None
    return keras


def _collective_multi_worker(strategy: Any) -> bool:
    return bool(strategy is not None and _trainer_module()._collective_all_reduce_multi_worker(strategy))


def _mended_symbolic_build(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or strategy.num_replicas_in_sync == 1:
            return original(self, iterator=iterator, data_batch=data_batch)
        from keras import tree

        for _, _, epoch_iterator in iterator:
            # One replica's batch has every shape building needs; reducing the batch over the replicas
            # is what fails: across workers (upstream keras-team/keras#20585), and on one machine when the
            # first batch does not split evenly over the replicas (AddN of [13, 64] and [11, 64]).
            data_batch = tree.map_structure(
                lambda value: None if value is None else strategy.experimental_local_results(value)[0],
                next(epoch_iterator))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    _maybe_symbolic_build.tensorfleet_mend = True  # type: ignore[attr-defined]
    return _maybe_symbolic_build


def _mended_reduce_per_replica(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        if reduction not in ("auto", "mean") or not _collective_multi_worker(strategy):
            return original(values, strategy, reduction)
        from keras import tree

        # Element-wise mean over the replicas of every worker, as one worker's path computes it
        # (axis=0 fails on the scalar logs: upstream keras-team/keras#20585).
        return tree.map_structure(lambda value: strategy.reduce("MEAN", value, axis=None), values)

    reduce_per_replica.tensorfleet_mend = True  # type: ignore[attr-defined]
    return reduce_per_replica


def fit_mended() -> bool:
    """Whether :func:`mend_fit`'s mends are installed in this process."""
    return bool(_originals)


def mend_fit() -> bool:
    """Mends Keras 3's TensorFlow trainer for ``MultiWorkerMirroredStrategy`` (upstream keras-team/keras#20585).

    Idempotent: a second call changes nothing. Nothing is done (and False returned) when this process does not
    use Keras 3 on the TensorFlow backend (Keras 3 is neither imported nor what ``tf.keras`` is), or when its
    version is not one of :data:`CHECKED_VERSIONS` (a warning names the version, the issue and what to do).

    Returns:
        True when the mends are installed (now or before).
    """
    if _originals:
        return True
    keras = keras3_in_use()
    if keras is None:
        return False
    version = ".".join(keras.__version__.split(".")[:2])
    if version not in CHECKED_VERSIONS:
        log.warning("Keras %s is not a version tensorfleet checked its multi-worker fit mends on (%s): its "
                    "TensorFlow trainer is left as it is. If fit fails under multi_worker_mirrored with "
                    "'PerReplica ... to a Tensor' or 'Invalid reduction dimension 0', that is %s; use Keras %s.",
                    keras.__version__, ", ".join(f"{v}.x" for v in CHECKED_VERSIONS), UPSTREAM_ISSUE,
                    CHECKED_VERSIONS[-1])
        return False
    trainer = _trainer_module()
    _originals["_maybe_symbolic_build"] = trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
    _originals["reduce_per_replica"] = trainer.reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = _mended_symbolic_build(_originals["_maybe_symbolic_build"])
    # Looked up as a global of the trainer module at every call, so replacing it there reaches fit,
    # evaluate and predict.
    trainer.reduce_per_replica = _mended_reduce_per_replica(_originals["reduce_per_replica"])
    keras3_checkpoints.mend_model_checkpoint()  # non-chief workers' saves to scratch folders
    log.info("Mended Keras %s's TensorFlow trainer for MultiWorkerMirroredStrategy (%s).", keras.__version__,
             UPSTREAM_ISSUE)
    return True


def restore_fit() -> None:
    """Puts Keras 3's own trainer functions back (a no-op when :func:`mend_fit` installed nothing)."""
    if not _originals:
        return
    trainer = _trainer_module()
    trainer.TensorFlowTrainer._maybe_symbolic_build = _originals.pop("_maybe_symbolic_build")
    trainer.reduce_per_replica = _originals.pop("reduce_per_replica")
    keras3_checkpoints.restore_model_checkpoint()


# ---------------------------------------------------------------------------------------------------------------
# A Keras 3 model on a DTensor mesh (tensorfleet.model_parallel.mesh.keras3_model)
#
# Keras 3's TensorFlow backend has no distribution (keras-team/keras#18473); tensorfleet lays a Keras 3 model's
# weights out as DTensor DVariables as they are created, and runs Keras 3's own fit/evaluate loops with the step
# split in two functions. What that needs of Keras 3's private parts (checked on 3.15.1) is here.

_slot = threading.local()


def building() -> tuple[Any, str] | None:
    """``(caller, path)`` of the innermost Keras 3 name scope, while Keras 3 creates a variable there: the layer
    (or optimizer, metric, seed generator) that creates it and the scope's path (``"block/d1"``; the variable's
    path is that plus its name). None outside any Keras 3 name scope (and in a process that never imported
    Keras 3): a variable tf_keras or plain TensorFlow creates."""
    if "keras" not in sys.modules or keras_major_in_use() < 3:
        return None
    from keras.src.backend.common import global_state
    from keras.src.backend.common.name_scope import current_path

    stack = global_state.get_global_attribute("name_scope_stack")
    if not stack:
        return None
    return stack[-1].caller, current_path()


def keras_major_in_use() -> int:
    """The major version of the imported ``keras`` package (0 when it has none)."""
    try:
        return int(str(getattr(sys.modules.get("keras"), "__version__", "0")).split(".")[0])
    except ValueError:
        return 0


def slot_reference() -> Any:
    """Inside :func:`slots_like_references`, while the optimizer creates a slot: the weight it is for."""
    return getattr(_slot, "reference", None)


@contextlib.contextmanager
def slots_like_references(optimizer: Any) -> Iterator[None]:
    """Inside, every slot ``optimizer`` (a Keras 3 optimizer) creates for a weight (Adam's momentum and
    velocity, SGD's momentum: ``add_variable_from_reference``) is announced by :func:`slot_reference`, so that
    a variable creator can give it its weight's layout (the slot's initial value is ``zeros(shape)``, which
    carries no layout)."""
    original = optimizer.add_variable_from_reference

    def add_variable_from_reference(reference_variable: Any, *args: Any, **kwargs: Any) -> Any:
        _slot.reference = reference_variable
        try:
            return original(reference_variable, *args, **kwargs)
        finally:
            _slot.reference = None

    object.__setattr__(optimizer, "add_variable_from_reference", add_variable_from_reference)
    try:
        yield
    finally:
        object.__delattr__(optimizer, "add_variable_from_reference")


def trainer_compile(model: Any, *args: Any, **kwargs: Any) -> Any:
    """Keras 3's own ``compile`` of ``model`` (``Trainer.compile``), whatever ``keras.Model.compile`` is at the
    moment (``Mesh.scope()`` intercepts it)."""
    from keras.src.trainers.trainer import Trainer

    return Trainer.compile(model, *args, **kwargs)


def build_state(model: Any, x: Any, y: Any) -> None:
    """Creates the state of ``model``'s compiled loss and metrics now, from a batch ``x, y`` (arrays; only
    their shapes and dtypes are read), as Keras 3 does under a distribution strategy
    (``_symbolic_build``). Without one, Keras 3 creates them while tracing the first step, inside a
    ``tf.function``, where a variable creator cannot make them DVariables."""
    model._symbolic_build(data_batch=(x, y))


def _predicted(model: Any, x: Any, training: bool) -> Any:
    return model(x, training=training) if model._call_has_training_arg else model(x)


def _batch_size(x: Any) -> Any:
    import tensorflow as tf

    return tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]


def split_train_function(model: Any, gradient_layout: Callable[[Any, Any], Any],
                         gradient_override: dict[str, str] | None = None) -> Callable[[Any], Any]:
    """Keras 3's TensorFlow ``train_step`` (3.15.1) as two ``tf.function`` calls per step, the ``train_function``
    Keras 3's ``fit`` calls with the iterator of a ``DTensorDataset``.

    1. the forward pass, the loss and the gradients, each gradient passed through
       ``gradient_layout(gradient, tf_variable)`` (relaid out like its variable); ``tf.gradients``, not a
       tape, so that ``gradient_override`` (op type -> registered gradient) reaches the ops it names;
    2. the loss tracker, the optimizer's update and the metrics.

    Measured on TensorFlow 2.21, a 2x2 mesh, 5 Adam steps of a conv + skip + LayerNormalization model: as one
    function (Keras 3's own step), the logged loss lagged one step (0.0 at the first step) and the weights ended
    0.048 from one device's; as these two, the step losses are within 2.4e-7 and the weights within 3.5e-6.
    Keras 3's own ``train_function`` also wraps each step's logs in a ``tf.experimental.Optional``, which
    DTensor cannot lay out ("'tf.OptionalFromValue' op does not implement layout propagation").
    """
    import tensorflow as tf

    from tensorfleet.compat.keras import tf_variable

    weights = list(model.trainable_weights)
    variables = [tf_variable(w) for w in weights]

    @tf.function
    def gradients(x: Any, y: Any) -> Any:
        with tf.compat.v1.get_default_graph().gradient_override_map(gradient_override or {}):
            y_pred = _predicted(model, x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, training=True)
            scaled = model.optimizer.scale_loss(loss)
        grads = tf.gradients(scaled, variables)
        return y_pred, loss, [None if g is None else gradient_layout(g, v) for g, v in zip(grads, variables)]

    @tf.function
    def update(x: Any, y: Any, y_pred: Any, loss: Any, grads: Any) -> Any:
        model._loss_tracker.update_state(loss, sample_weight=_batch_size(x))
        model.optimizer.apply_gradients([(g, w) for g, w in zip(grads, weights) if g is not None])
        return model.compute_metrics(x, y, y_pred, sample_weight=None)

    def train_function(iterator: Any) -> Any:
        x, y = next(iterator)
        return update(x, y, *gradients(x, y))

    return train_function


def split_test_function(model: Any) -> Callable[[Any], Any]:
    """Keras 3's ``test_step`` as two ``tf.function`` calls per batch (the forward pass; then the loss, the loss
    tracker and the metrics), the ``test_function`` of ``evaluate`` over a ``DTensorDataset``."""
    import tensorflow as tf

    forward = tf.function(lambda x: _predicted(model, x, training=False))

    @tf.function
    def update(x: Any, y: Any, y_pred: Any) -> Any:
        loss = model._compute_loss(x=x, y=y, y_pred=y_pred, training=False)
        model._loss_tracker.update_state(loss, sample_weight=_batch_size(x))
        return model.compute_metrics(x, y, y_pred, sample_weight=None)

    def test_function(iterator: Any) -> Any:
        x, y = next(iterator)
        return update(x, y, forward(x))

    return test_function


def layer_calls(layer: Any) -> list[list[Any]]:
    """For each call of a Keras 3 ``layer`` in a functional graph, the layers (or InputLayers) whose outputs it
    read: Keras 3's ``Node.parent_nodes`` (tf_keras has the public ``inbound_nodes[i].inbound_layers``)."""
    return [[parent.operation for parent in node.parent_nodes] for node in layer._inbound_nodes]


__all__ += ["build_state", "building", "layer_calls", "slot_reference", "slots_like_references", "split_test_function",
            "split_train_function", "trainer_compile"]
