"""Mesh-TensorFlow layouts for Keras models, run by Mesh-TF itself, tensor-parallel Keras or DTensor.

A layout is a Mesh-TF mesh shape such as ``"b1:2;b2:2"`` and layout rules such as
``"batch:b1;hidden:b2"`` (:class:`MeshLayout`, parsed by mesh-tensorflow itself). One object,
:class:`Mesh`, runs a layout in one of three ways (:class:`MeshBackend`), each in a module of
its own named after it:

1. ``"mtf"`` (:mod:`~tensorfleet.model_parallel.mesh.mtf`): the Keras model written out as a
   Mesh-TF graph, lowered by ``PlacementMeshImpl`` and trained in a ``tf.compat.v1.Session``.
2. ``"keras"`` (:mod:`~tensorfleet.model_parallel.mesh.keras`): the model rebuilt from
   tensorfleet's tensor-parallel layers over a (data x model) grid of devices.
3. ``"dtensor"`` (:mod:`~tensorfleet.model_parallel.mesh.dtensor`): every weight a
   ``tf.experimental.dtensor`` DVariable laid out by the rules.

All three train with plain SGD on the mean softmax cross-entropy of integer labels
(:mod:`~tensorfleet.model_parallel.mesh.training`) and, when done, write the trained weights back
into the Keras model. Supported models, and the names of their tensor dimensions, are in
:mod:`~tensorfleet.model_parallel.mesh.dimensions` (:func:`model_dimensions`).

Example:
    >>> import tensorfleet as tfl
    >>> from tensorfleet.model_parallel.mesh import Mesh
    >>> split = tfl.models.datasets.load_digits(flat=True)
    >>> model = tfl.models.build("digits_mlp")
    >>> mesh = Mesh("b1:2;b2:2", "batch:b1;hidden:b2", backend="mtf")
    >>> history = mesh.fit(model, split.x_train[:256], split.y_train[:256], epochs=2, batch_size=32,
    ...                    verbose=False)
    >>> history.devices
    ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2', '/device:CPU:3']
    >>> len(history.step_loss), history.loss[1] < history.loss[0]
    (16, True)
"""

from __future__ import annotations

import enum
import importlib
from typing import Any, ContextManager, Mapping, Sequence

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

    MTF = "mtf"
    KERAS = "keras"
    DTENSOR = "dtensor"


BACKENDS: Registry[MeshBackend] = Registry("mesh backend")
BACKENDS.register("mtf", MeshBackend.MTF, aliases=("mesh_tensorflow", "graph"),
                  description="Mesh-TensorFlow graph lowered by PlacementMeshImpl, tf.compat.v1 session.")
BACKENDS.register("keras", MeshBackend.KERAS, aliases=("tensor_parallel", "eager"),
                  description="Keras with tensorfleet's tensor-parallel layers over a (data x model) mesh.")
BACKENDS.register("dtensor", MeshBackend.DTENSOR, aliases=("tf_dtensor",),
                  description="The Keras model's weights as DTensor DVariables laid out on a tf.experimental.dtensor mesh.")


class Mesh:
    """A device mesh with a Mesh-TF layout, and the way it trains a Keras model.

    Args:
        mesh_shape: Mesh-TF mesh shape, e.g. ``"b1:2;b2:2"``.
        layout: Mesh-TF layout rules, e.g. ``"batch:b1;hidden:b2"``.
        backend: ``"mtf"`` (Mesh-TensorFlow graph), ``"keras"`` (tensor-parallel Keras layers)
            or ``"dtensor"`` (DTensor DVariables).
        devices: device names; default: the logical CPU devices (or GPUs, where present).
        zero: ZeRO stage of :meth:`keras_model` training over the mesh dimension of ``batch``
            (:mod:`.zero`): 0; 1 splits each optimizer slot over it too (on its first axis that is
            whole and divisible); 2 also the gradients; 3 also the trainable weights themselves.

    Example:
        >>> import tensorfleet as tfl
        >>> data = tfl.models.datasets.load_digits()
        >>> x, y = data.x_train[:256, ..., 0], data.y_train[:256]  # each digit as 8 rows of 8 pixels
        >>> mesh = Mesh("b1:2;b2:2", "batch:b1;hidden:b2;heads:b2", backend="keras")
        >>> model = tfl.models.build("transformer_block")
        >>> history = mesh.fit(model, x, y, epochs=2, batch_size=32, learning_rate=0.1, verbose=False)
        >>> history.grid  # [data replica][model shard]
        [['/device:CPU:0', '/device:CPU:1'], ['/device:CPU:2', '/device:CPU:3']]
        >>> len(history.step_loss), history.loss[1] < history.loss[0]
        (16, True)
    """

    def __init__(self, mesh_shape: str, layout: str = "", *, backend: str | MeshBackend = "mtf",
                 devices: Sequence[str] | None = None, zero: int = 0) -> None:
        self.layout = MeshLayout(mesh_shape, layout)
        self.zero = integer("zero", zero, minimum=0, maximum=3)
        """ZeRO stage of ``keras_model`` training (Rajbhandari et al., 2020): 1 splits the optimizer
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

        available = self._devices
        if available is None:
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

            self._dtensor_mesh = dtensor.create_mesh(list(self.layout.mesh_dims.items()), devices=self.devices)
        return self._dtensor_mesh

    def scope(self, patterns: Mapping[str, Sequence[str | None]] | None = None) -> ContextManager[KerasLayout]:
        """Lays out every Keras weight created inside by the layout rules (and ``patterns``).

        Any backend: the weights become DTensor DVariables (see :mod:`.keras_layout` for the
        dimension names of each layer's weights and why).

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
            >>> [(w.path, w.mesh_axes) for w in layout.decided]  # doctest: +SKIP
            [('d/kernel', (None, 'm')), ('d/bias', ('m',))]
        """
        from tensorfleet.model_parallel.mesh.keras_model import mesh_scope

        self.keras_layout = KerasLayout(self.layout.mesh_dims, self.layout.rules, patterns)
        return mesh_scope(self.keras_layout, self.dtensor_mesh, zero=self.zero)

    def keras_model(self, model: Any) -> Any:
        """The Keras model that trains ``model`` (built in :meth:`scope`) with Keras' own
        ``compile`` / ``fit`` / ``evaluate`` / ``predict``; see
        :func:`~tensorfleet.model_parallel.mesh.keras_model.keras_mesh_model`.

        Example:
            >>> import numpy as np, tensorflow as tf
            >>> mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
            >>> with mesh.scope():  # doctest: +SKIP
            ...     model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4)])
            ...     trainer = mesh.keras_model(model)
            ...     trainer.compile(optimizer="adam", loss="mse")
            >>> history = trainer.fit(np.ones((64, 8)), np.zeros((64, 4)), batch_size=16, verbose=0)  # doctest: +SKIP
            >>> len(history.history["loss"])  # doctest: +SKIP
            1
        """
        from tensorfleet.compat.keras import require_keras2
        from tensorfleet.model_parallel.mesh.keras_model import keras_mesh_model

        require_keras2(model, "Mesh.keras_model")
        self._require_scope(model)
        return keras_mesh_model(model, self.keras_layout, self.dtensor_mesh, zero=self.zero)

    def _require_scope(self, model: Any) -> None:
        """One clear error for a model not built in :meth:`scope` (nothing laid out yet)."""
        if self.keras_layout is None:
            raise ValueError("Build the model inside mesh.scope() first, so that its weights are laid out on the "
                             f"mesh. Received: model {getattr(model, 'name', model)!r} and no scope entered")

    def weight_splits(self, model: Any) -> list[Any]:
        """Each weight of ``model`` (built in the last :meth:`scope`) as this mesh lays it out, for the
        planner (:func:`tensorfleet.planner.splits.estimate`): its elements, the parts its layout
        splits it into, the parts ZeRO splits its states into over the batch dimension; see
        :func:`~tensorfleet.model_parallel.mesh.zero.weight_splits`.

        Example:
            >>> import tensorflow as tf
            >>> mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
            >>> with mesh.scope():  # doctest: +SKIP
            ...     model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4)])
            >>> mesh.weight_splits(model)  # doctest: +SKIP
            [WeightSplit(parameters=32, parts=2, zero_parts=2, trainable=True), WeightSplit(parameters=4, parts=2, zero_parts=1, trainable=True)]
        """
        from tensorfleet.compat.keras import require_keras2
        from tensorfleet.model_parallel.mesh.zero import weight_splits

        require_keras2(model, "Mesh.weight_splits")
        self._require_scope(model)
        return weight_splits(model, self.keras_layout)

    def check(self, model: Any, batch_size: int) -> dict[str, int]:
        """Validates the layout against ``model`` and the devices; returns the model's dimensions."""
        dims = model_dimensions(model, batch_size)
        self.layout.check(dims, len(self.devices))
        return dims

    def fit(self, model: Any, x: Any, y: Any, *, epochs: int = 1, batch_size: int = 32,
            learning_rate: float = 0.1, verbose: bool = True) -> MeshHistory:
        """Trains ``model`` under the layout with SGD; writes the trained weights back into it.

        Batches are taken in order (no shuffling); a last batch smaller than ``batch_size``
        is dropped (Mesh-TF graphs have a fixed batch dimension).

        Args:
            model: a built Keras model of the supported kind (see :mod:`~tensorfleet.model_parallel.mesh.dimensions`).
            x: inputs, ``(n, features)`` or ``(n, seq, features)``.
            y: integer class labels, ``(n,)``.
            epochs: passes over the data.
            batch_size: global batch size (split over the ``batch`` mesh dimension).
            learning_rate: SGD step size.
            verbose: show a progress bar.

        Returns:
            A :class:`MeshHistory` with per-epoch and per-step losses.

        Raises:
            ValueError: a model that is not built, not a chain, or has a layer no backend runs (the
                message names the layer, its type and what a Mesh supports:
                :data:`~tensorfleet.model_parallel.mesh.dimensions.SUPPORTED`), ``x`` of another
                shape than the model's input, or a layout the model or the devices do not fit.
            TypeError: ``model`` is not a Keras model.
        """
        x, _, batches = training_batches(x, y, epochs, batch_size, learning_rate)
        dims = self.check(model, batch_size)
        expected = tuple(model.inputs[0].shape[1:])
        if len(expected) != x.ndim - 1 or any(e is not None and e != g for e, g in zip(expected, x.shape[1:])):
            raise ValueError(f"x must hold examples of the model's input shape {expected}. Received: x of shape "
                             f"{x.shape} for model {model.name!r}")
        backend = importlib.import_module(f"{__name__}.{self.backend.value}")
        return backend.train(self, model, dims, batches, epochs=epochs, learning_rate=learning_rate, verbose=verbose)

    def fit_mtf(self, model_fn: Any, x: Any, y: Any, *, dims: Mapping[str, int], epochs: int = 1,
                batch_size: int = 32, learning_rate: float = 0.1, seed: int | None = 0,
                verbose: bool = True) -> MeshHistory:
        """Trains a model written with Mesh-TF layers under the layout (always the mtf backend).

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
            verbose: show a progress bar.

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
        x, _, batches = training_batches(x, y, epochs, batch_size, learning_rate)
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
        from tensorfleet.model_parallel.mesh.mtf import train_mtf_model

        return train_mtf_model(self, model_fn, full, batches, epochs=epochs, learning_rate=learning_rate,
                               verbose=verbose, seed=seed)
