"""A device mesh and a Mesh-TF layout, used like a strategy: build and compile inside ``mesh.scope()``.

A layout is one object, :class:`MeshLayout`: a Mesh-TF mesh shape such as ``"b:2;m:2"`` and layout
rules such as ``"batch:b;hidden:m"``, parsed by mesh-tensorflow itself. :class:`Mesh` holds it with
the devices, and one way in for every backend (:class:`MeshBackend`, each a module of this package
that reads the layout)::

    mesh = Mesh("b:2;m:2", "batch:b;hidden:m")            # backend="dtensor" by default
    with mesh.scope():
        model = build_my_keras_model()                      # the user's own model
        model.compile(optimizer="adam", loss=..., metrics=[...])
    model.fit(x, y, batch_size=32, epochs=3)                # Keras' fit; evaluate, predict, save too

1. ``"dtensor"`` (default): every weight created inside the scope is a DTensor DVariable laid out
   by the rules (:mod:`~tensorfleet.model_parallel.mesh.keras_layout`); any Keras model, loss and
   optimizer, in Keras 3 or tf_keras; the model's ``compile`` inside the scope hands a tf_keras
   model to a :class:`~tensorfleet.model_parallel.mesh.keras_trainer.MeshTrainer`, and makes a
   Keras 3 model a :class:`~tensorfleet.model_parallel.mesh.keras3_model.MeshModel` (Keras 3's own
   loops; ZeRO is tf_keras's only).
2. ``"mtf"`` (:mod:`~tensorfleet.model_parallel.mesh.mtf`): the Keras model written out as a
   Mesh-TF graph by mesh-tensorflow's own lowering (``PlacementMeshImpl``), run in a
   ``tf.compat.v1.Session``.
3. ``"keras"`` (:mod:`~tensorfleet.model_parallel.mesh.keras`): the model rebuilt from
   tensorfleet's tensor-parallel layers over a (data x model) grid of devices.

Under ``tensorfleet launch --workers N --mesh`` (or with DTensor's ``DTENSOR_*`` environment) the
``dtensor`` backend's mesh spans the devices of all N processes, each holding its share, and the
same script runs unchanged (:mod:`~tensorfleet.model_parallel.mesh.clients`).

The ``mtf`` and ``keras`` backends (and the chain form of ``dtensor`` that :meth:`Mesh.fit` uses)
run chain models of tf_keras (:mod:`~tensorfleet.model_parallel.mesh.dimensions`) with plain SGD on the
softmax cross-entropy of logits; each makes one training step, and the loop over batches and
epochs is Keras' own ``fit`` (:class:`~tensorfleet.model_parallel.mesh.step_trainer.StepTrainer`).
:meth:`Mesh.fit` and :meth:`Mesh.fit_mtf` are shorthands for the same (compile with SGD, then
``fit``) that return a :class:`MeshHistory` of every step; ``Mesh.keras_model(model)`` returns the
model itself, ready for the mesh.

Example:
    >>> import tf_keras  # the mtf and keras backends run Keras 2 (tf_keras) models
    >>> import tensorfleet as tfl
    >>> from tensorfleet.model_parallel.mesh import Mesh
    >>> split = tfl.models.datasets.load_digits(flat=True)
    >>> mesh = Mesh("b1:2;b2:2", "batch:b1;hidden:b2", backend="mtf")
    >>> with mesh.scope():
    ...     model = tfl.models.build("digits_mlp", keras="tf_keras")
    ...     model.compile(tf_keras.optimizers.SGD(0.1),
    ...                   tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> history = model.fit(split.x_train[:256], split.y_train[:256], epochs=2, batch_size=32, verbose=0)
    >>> loss = history.history["loss"]
    >>> len(loss), loss[1] < loss[0]
    (2, True)
"""

from __future__ import annotations

import contextlib
import enum
from typing import Any, ContextManager, Iterator, Mapping, Sequence

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel.mesh.dimensions import model_dimensions
from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout, WeightLayout
from tensorfleet.model_parallel.mesh.layout import MeshLayout
from tensorfleet.model_parallel.mesh.training import MeshHistory, training_batches
from tensorfleet.registry import Registry
from tensorfleet.validation import integer, positive_int

__all__ = [
    "Mesh",
    "MeshBackend",
    "MeshHistory",
    "MeshLayout",
    "BACKENDS",
    "KerasLayout",
    "WeightLayout",
    "model_dimensions",
]


class MeshBackend(str, enum.Enum):
    """How a layout runs; each backend is the module of this package named after its value."""

    DTENSOR = "dtensor"
    MTF = "mtf"
    KERAS = "keras"


BACKENDS: Registry[MeshBackend] = Registry("mesh backend")
BACKENDS.register("dtensor", MeshBackend.DTENSOR, aliases=("tf_dtensor",),
                  description="Every Keras weight a DTensor DVariable laid out on a tf.experimental.dtensor mesh; "
                              "any Keras model, loss and optimizer.")
BACKENDS.register("mtf", MeshBackend.MTF, aliases=("mesh_tensorflow", "graph"),
                  description="Mesh-TensorFlow graph lowered by PlacementMeshImpl, tf.compat.v1 session.")
BACKENDS.register("keras", MeshBackend.KERAS, aliases=("tensor_parallel", "eager"),
                  description="Keras with tensorfleet's tensor-parallel layers over a (data x model) mesh.")


class Mesh:
    """A device mesh with a Mesh-TF layout; a Keras model built and compiled in :meth:`scope` trains on it.

    Args:
        mesh_shape: Mesh-TF mesh shape, e.g. ``"b1:2;b2:2"``.
        layout: Mesh-TF layout rules, e.g. ``"batch:b1;hidden:b2"``.
        backend: ``"dtensor"`` (DTensor DVariables, any Keras model), ``"mtf"`` (Mesh-TensorFlow
            graph) or ``"keras"`` (tensor-parallel Keras layers).
        devices: device names; default: the GPUs, where present, else the logical CPUs (a CPU that
            TensorFlow has not split yet is split into the mesh's devices). With ``DTENSOR_JOBS`` set
            (``tensorfleet launch --mesh``) the mesh spans the devices of every process of the job
            (:mod:`.clients`), each process holding its share.
        zero: ZeRO stage of the dtensor backend's training over the mesh dimension of ``batch``
            (:mod:`.zero`): 0; 1 splits each optimizer slot over it too (on its first axis that is
            whole and divisible); 2 also the gradients; 3 also the trainable weights themselves.

    Example (:meth:`fit`, the shorthand that also records every step):
        >>> import tensorfleet as tfl
        >>> data = tfl.models.datasets.load_digits()
        >>> x, y = data.x_train[:256, ..., 0], data.y_train[:256]  # each digit as 8 rows of 8 pixels
        >>> mesh = Mesh("b1:2;b2:2", "batch:b1;hidden:b2;heads:b2", backend="keras")
        >>> model = tfl.models.build("transformer_block", keras="tf_keras")  # this backend runs Keras 2 models
        >>> history = mesh.fit(model, x, y, epochs=2, batch_size=32, learning_rate=0.1, verbose=False)
        >>> history.grid  # [data replica][model shard]
        [['/device:CPU:0', '/device:CPU:1'], ['/device:CPU:2', '/device:CPU:3']]
        >>> len(history.step_loss), history.loss[1] < history.loss[0]
        (16, True)
    """

    def __init__(self, mesh_shape: str, layout: str = "", *, backend: str | MeshBackend = "dtensor",
                 devices: Sequence[str] | None = None, zero: int = 0) -> None:
        self.layout = MeshLayout(mesh_shape, layout)
        self.zero = integer("zero", zero, minimum=0, maximum=3)
        """ZeRO stage of the dtensor backend's training (Rajbhandari et al., 2020): 1 splits the optimizer
        state over the batch mesh dimension, 2 also the gradients, 3 also the parameters."""
        self.backend = BACKENDS.get(backend.value if isinstance(backend, MeshBackend) else backend)
        self._devices = list(devices) if devices is not None else None
        self._dtensor_mesh: Any = None
        self.keras_layout: KerasLayout | None = None
        """The layouts given to the weights built in the last :meth:`scope` (``.summary()`` lists them)."""

    @property
    def devices(self) -> list[str]:
        """The devices of the mesh, in processor order (``mesh.size`` of them)."""
        import tensorflow as tf

        if self._across_processes():
            from tensorfleet.model_parallel.mesh.clients import global_devices

            return global_devices(self.dtensor_mesh)
        available = self._devices
        if available is None:
            from tensorfleet.model_parallel.mesh.clients import split_cpu

            split_cpu(self.layout.size)  # a CPU not yet split: into the mesh's devices
            available = [d.name for d in tf.config.list_logical_devices("GPU")] or \
                        [d.name for d in tf.config.list_logical_devices("CPU")]
        if self.layout.size > len(available):
            raise ValueError(f"The mesh {self.layout.mesh_shape!r} needs {self.layout.size} devices but only "
                             f"{len(available)} are available ({', '.join(available)}); use a smaller mesh or more "
                             f"devices. Received: mesh_shape={self.layout.mesh_shape!r}")
        return list(available[: self.layout.size])

    @property
    def dtensor_mesh(self) -> Any:
        """The ``tf.experimental.dtensor`` mesh of these devices, with the Mesh-TF dimension names."""
        if self._dtensor_mesh is None:
            from tensorflow.experimental import dtensor

            if self._across_processes():
                from tensorfleet.model_parallel.mesh.clients import distributed_mesh

                self._dtensor_mesh = distributed_mesh(self.layout.mesh_dims, self.layout.mesh_shape)
            else:
                self._dtensor_mesh = dtensor.create_mesh(list(self.layout.mesh_dims.items()), devices=self.devices)
        return self._dtensor_mesh

    def _across_processes(self) -> bool:
        """Whether this mesh spans the processes of a multi-client DTensor job (:mod:`.clients`)."""
        from tensorfleet.model_parallel.mesh.clients import is_multi_client

        if not is_multi_client():
            return False
        if self.backend is not MeshBackend.DTENSOR or self._devices is not None:
            given = f"backend={self.backend.value!r}" + (f", devices={self._devices!r}" if self._devices else "")
            raise ValueError("A mesh across processes (DTENSOR_JOBS is set: tensorfleet launch --mesh) is the dtensor "
                             "backend's over every process's devices; the mtf and keras backends and devices= name "
                             f"devices of one process. Use Mesh(shape, layout) alone, or run in one process. Received: "
                             f"{given}")
        return True

    def scope(self, patterns: Mapping[str, Sequence[str | None]] | None = None) -> ContextManager[KerasLayout]:
        """The way in, as a strategy's scope: a Keras model built and compiled inside trains on the mesh
        with its own ``fit``, ``evaluate``, ``predict``, ``get_weights`` and ``save``.

        With the ``dtensor`` backend every Keras weight created inside is laid out by the layout
        rules (and ``patterns``) as a DTensor DVariable (see :mod:`.keras_layout` for the dimension
        names of each layer's weights and why); a model compiled inside whose weights were made
        before it is one clear error at its ``compile``. With ``mtf`` and ``keras`` the weights stay
        Keras' own, and ``compile`` checks the model, the optimizer (SGD) and the loss.

        Args:
            patterns: regular expression over weight paths (``"d1/kernel"``) -> one mesh
                dimension name (or ``None``) per axis of the weight; wins over the rules.

        Example:
            >>> import tensorflow as tf
            >>> mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
            >>> # DTensor in a process of its own (tests/model_parallel/test_mesh_keras.py): its collectives
            >>> # clash with tf.distribute strategies built in the same process (group key 1, TF 2.14)
            >>> with mesh.scope() as layout:  # doctest: +SKIP
            ...     model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4, name="d")])
            ...     model.compile(optimizer="adam", loss="mse")
            >>> [(w.path, w.mesh_axes) for w in layout.decided]  # doctest: +SKIP
            [('d/kernel', (None, 'm')), ('d/bias', ('m',))]
        """
        self.keras_layout = KerasLayout(self.layout.mesh_dims, self.layout.rules, patterns)
        return _scope(self)

    def keras_model(self, model: Any) -> Any:
        """``model`` itself, made ready for the mesh now rather than at its ``compile`` inside
        :meth:`scope` (the same thing: the same object, its class mixed with
        :class:`~tensorfleet.model_parallel.mesh.keras_model.OnMesh`). Kept for code written
        before ``compile`` inside the scope was the way in; new code does not need it.
        """
        from tensorfleet.compat.keras import require_keras2
        from tensorfleet.model_parallel.mesh.keras_model import OnMesh, attach

        require_keras2(model, "Mesh.keras_model")
        self._require_scope(model)
        if isinstance(model, OnMesh) and model.mesh_trainer is not None:
            return model
        return attach(model, self.trainer(model))

    def trainer(self, model: Any) -> Any:
        """What trains ``model`` on this mesh: a :class:`~.keras_trainer.MeshTrainer` (``dtensor``, the model
        built inside :meth:`scope`) or a :class:`~.step_trainer.StepTrainer` (``mtf``, ``keras``)."""
        if self.backend is MeshBackend.DTENSOR:
            from tensorfleet.model_parallel.mesh.keras_model import dtensor_trainer

            return dtensor_trainer(model, self._require_scope(model), self.dtensor_mesh, zero=self.zero)
        from tensorfleet.model_parallel.mesh.dimensions import mesh_steps
        from tensorfleet.model_parallel.mesh.step_trainer import StepTrainer

        mesh_steps(model)  # one clear error now for a model the backend cannot run
        return StepTrainer(self, model)

    def _require_scope(self, model: Any) -> KerasLayout:
        """The layout of the last :meth:`scope`; one clear error for a model not built in one (nothing laid out yet)."""
        if self.keras_layout is None:
            raise ValueError("Build the model inside mesh.scope() first, so that its weights are laid out on the "
                             f"mesh. Received: model {getattr(model, 'name', model)!r} and no scope entered")
        return self.keras_layout

    def weight_splits(self, model: Any) -> list[Any]:
        """Each weight of ``model`` (built in the last :meth:`scope`) as this mesh lays it out, for the
        planner (:func:`tensorfleet.planner.splits.estimate`): its elements, the parts its layout
        splits it into, the parts ZeRO splits its states into over the batch dimension (a Keras 3 model
        as a tf_keras one); see
        :func:`~tensorfleet.model_parallel.mesh.zero.weight_splits`.

        Example:
            >>> import tensorflow as tf
            >>> mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
            >>> with mesh.scope():  # doctest: +SKIP
            ...     model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4)])
            >>> mesh.weight_splits(model)  # doctest: +SKIP
            [WeightSplit(parameters=32, parts=2, zero_parts=2, trainable=True), WeightSplit(parameters=4, parts=2,
            zero_parts=1, trainable=True)]
        """
        from tensorfleet.model_parallel.mesh.zero import weight_splits

        return weight_splits(model, self._require_scope(model))

    def check(self, model: Any, batch_size: int) -> dict[str, int]:
        """Validates the layout against ``model`` and the devices; returns the model's dimensions."""
        dims = model_dimensions(model, batch_size)
        self.layout.check(dims, len(self.devices))
        return dims

    def fit(self, model: Any, x: Any, y: Any, *, epochs: int = 1, batch_size: int = 32,
            learning_rate: float = 0.1, verbose: bool = True) -> MeshHistory:
        """Shorthand for the way in, for a chain model built anywhere: ``model`` compiled for this mesh with
        ``tf.keras.optimizers.SGD(learning_rate)`` and the softmax cross-entropy of logits, then its
        Keras ``fit`` over the batches in order (no shuffling); the trained weights are in ``model``.

        Every backend runs the same chain models (:mod:`~tensorfleet.model_parallel.mesh.dimensions`):
        ``mtf`` and ``keras`` as with :meth:`scope`, ``dtensor`` in its chain form
        (:mod:`~tensorfleet.model_parallel.mesh.dtensor`), so that the three compare step for step.
        A last batch smaller than ``batch_size`` is dropped (Mesh-TF graphs have a fixed batch
        dimension). ``model`` stays ready for the mesh, as after :meth:`keras_model`.

        Args:
            model: a built Keras model of the supported kind.
            x: inputs, ``(n, features)`` or ``(n, seq, features)``.
            y: integer class labels, ``(n,)``.
            epochs: passes over the data.
            batch_size: global batch size (split over the ``batch`` mesh dimension).
            learning_rate: SGD step size.
            verbose: show Keras' progress bar.

        Returns:
            A :class:`MeshHistory` with per-epoch and per-step losses.

        Raises:
            ValueError: a model that is not built, not a chain, or has a layer no backend runs (the
                message names the layer, its type and what a Mesh supports:
                :data:`~tensorfleet.model_parallel.mesh.dimensions.SUPPORTED`), ``x`` of another
                shape than the model's input, or a layout the model or the devices do not fit.
            TypeError: ``model`` is not a Keras model.
        """
        from tensorfleet.model_parallel.mesh.keras_model import OnMesh, attach
        from tensorfleet.model_parallel.mesh.step_trainer import StepTrainer

        x, _, _ = training_batches(x, y, epochs, batch_size, learning_rate)
        self.check(model, batch_size)
        expected = tuple(model.inputs[0].shape[1:])
        if len(expected) != x.ndim - 1 or any(e is not None and e != g for e, g in zip(expected, x.shape[1:])):
            raise ValueError(f"x must hold examples of the model's input shape {expected}. Received: x of shape "
                             f"{x.shape} for model {model.name!r}")
        trainer = model.mesh_trainer if isinstance(model, OnMesh) else None
        if not isinstance(trainer, StepTrainer) or trainer.mesh is not self:
            trainer = StepTrainer(self, model)
            attach(model, trainer)
        model.compile(keras2().optimizers.SGD(learning_rate), keras2().losses.SparseCategoricalCrossentropy(True))
        return _fit_history(trainer, x, y, epochs=epochs, batch_size=batch_size, verbose=verbose)

    def fit_mtf(self, model_fn: Any, x: Any, y: Any, *, dims: Mapping[str, int], epochs: int = 1,
                batch_size: int = 32, learning_rate: float = 0.1, seed: int | None = 0,
                verbose: bool = True) -> MeshHistory:
        """Trains a model written with Mesh-TF layers under the layout (always the mtf backend), one
        step per batch of Keras' ``fit``, as :meth:`fit` does for a Keras model.

        Args:
            model_fn: ``model_fn(mtf, mesh, inputs, dims) -> logits``: builds the model with
                ``mtf`` (the mesh-tensorflow module; a plain ``import mesh_tensorflow`` in the
                user's own code works too once this package is imported) on ``mesh`` from
                ``inputs`` (dimensions ``batch``, [``seq``,] ``features``); ``dims`` maps
                every dimension name to its ``mtf.Dimension``. The logits must have a
                ``classes`` dimension.
            x: inputs, ``(n, features)`` or ``(n, seq, features)``.
            y: integer class labels.
            dims: sizes of the model's own dimensions (``classes`` and any others, such as
                ``hidden``); ``batch``, ``seq`` and ``features`` come from ``x`` and ``batch_size``.
            epochs: passes over the data.
            batch_size: global batch size.
            learning_rate: SGD step size.
            seed: graph-level random seed, so that initial weights do not depend on the mesh.
            verbose: show Keras' progress bar.

        Example:
            >>> def model_fn(mtf, mesh, inputs, dims):
            ...     h = mtf.layers.dense(inputs, dims["hidden"], activation=mtf.relu, name="hidden")
            ...     return mtf.layers.dense(h, dims["classes"], name="logits")
            >>> import tensorfleet as tfl
            >>> data = tfl.models.datasets.load_digits(flat=True)
            >>> x, y = data.x_train[:256], data.y_train[:256]
            >>> mesh = Mesh("b1:2;b2:2", "batch:b1;hidden:b2")
            >>> history = mesh.fit_mtf(model_fn, x, y, dims={"hidden": 64, "classes": 10}, epochs=2,
            ...                        verbose=False)
            >>> sorted(history.weights), history.weights["hidden/kernel"].shape
            (['hidden/bias', 'hidden/kernel', 'logits/bias', 'logits/kernel'], (64, 64))
            >>> len(history.step_loss), history.loss[1] < history.loss[0]
            (16, True)
        """
        from tensorfleet.model_parallel.mesh.mtf import prepare_mtf_model
        from tensorfleet.model_parallel.mesh.step_trainer import StepTrainer

        x, _, _ = training_batches(x, y, epochs, batch_size, learning_rate)
        if not isinstance(dims, Mapping) or "classes" not in dims:
            raise ValueError(f"dims must map dimension names to sizes and include 'classes'. Received: dims={dims!r}")
        full = {"batch": batch_size}
        if x.ndim == 3:
            full.update(seq=int(x.shape[1]), memory_seq=int(x.shape[1]))
        full["features"] = int(x.shape[-1])
        for name, size in dims.items():
            full[name] = positive_int(f"dims[{name!r}]", size)
        self.layout.check(full, len(self.devices))
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable as model_fn(mtf, mesh, inputs, dims). Received: {model_fn!r}")

        def prepare(_: int, x_shape: tuple[int, ...]) -> Any:
            return prepare_mtf_model(self, model_fn, full, x_shape=x_shape, learning_rate=learning_rate, seed=seed)

        mtf_mesh = Mesh(self.layout.mesh_shape, self.layout.layout, backend="mtf", devices=self._devices)
        trainer = StepTrainer(mtf_mesh, prepare=prepare)
        trainer.compile(keras2().optimizers.SGD(learning_rate), keras2().losses.SparseCategoricalCrossentropy(True))
        return _fit_history(trainer, x, y, epochs=epochs, batch_size=batch_size, verbose=verbose)


def _fit_history(trainer: Any, x: Any, y: Any, *, epochs: int, batch_size: int, verbose: bool) -> MeshHistory:
    """Keras' ``fit`` of ``trainer`` over the batches in order; the :class:`MeshHistory` of its steps."""
    first = len(trainer.step_loss)
    trainer.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=1 if verbose else 0)
    return trainer.mesh_history(epochs, first)


@contextlib.contextmanager
def _scope(mesh: Mesh) -> Iterator[KerasLayout]:
    """What :meth:`Mesh.scope` enters: ``compile`` of a model hands it to the mesh's trainer; with the
    dtensor backend, weights are laid out as they are created."""
    from tensorfleet.compat.tf_keras import intercept_compile
    from tensorfleet.model_parallel.mesh.keras_model import compile_on_mesh, mesh_scope

    layout = mesh.keras_layout
    assert layout is not None, "Mesh.scope sets the layout before it enters"
    with contextlib.ExitStack() as stack:
        if mesh.backend is MeshBackend.DTENSOR:
            stack.enter_context(mesh_scope(layout, mesh.dtensor_mesh, zero=mesh.zero))
        make_trainer = mesh.trainer
        if mesh.backend is MeshBackend.DTENSOR:  # a Keras 3 model on the mesh: keras3_model
            make_trainer = _takes_keras3(make_trainer)
        stack.enter_context(intercept_compile(compile_on_mesh(make_trainer)))
        yield layout


def _takes_keras3(make_trainer: Any) -> Any:
    """``make_trainer`` marked as one that trains Keras 3 models too (the dtensor backend's)."""

    def make(model: Any) -> Any:
        return make_trainer(model)

    make.takes_keras3 = True  # type: ignore[attr-defined]
    return make
