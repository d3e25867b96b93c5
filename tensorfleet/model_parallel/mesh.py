"""Mesh-TensorFlow layouts for Keras models, run by Mesh-TF itself or by tensor-parallel Keras.

A layout is what Mesh-TensorFlow users write (Shazeer et al., "Mesh-TensorFlow: Deep
Learning for Supercomputers", 2018): a mesh shape such as ``"b1:2;b2:2"`` (named mesh
dimensions and their sizes, ``b1 x b2`` devices) and layout rules such as
``"batch:b1;hidden:b2"`` (which tensor dimension is split over which mesh dimension). Both
strings are parsed by mesh-tensorflow's own ``convert_to_shape`` and
``convert_to_layout_rules``; :class:`MeshLayout` adds the checks that name what is wrong.

One object, :class:`Mesh`, runs a layout in one of three ways (:class:`MeshBackend`):

1. ``"mtf"``: the Keras model is written out as a Mesh-TF graph (``mtf.einsum`` and
   ``mtf`` variables initialised from the Keras weights), lowered by ``PlacementMeshImpl``
   onto the devices and trained in graph mode inside its own ``tf.Graph`` and
   ``tf.compat.v1.Session`` (eager mode stays on for everything else).
2. ``"keras"``: the Keras model is rebuilt from tensorfleet's tensor-parallel layers
   (:mod:`tensorfleet.model_parallel.tensor_parallel`): the batch is split over the mesh
   dimension that ``batch`` maps to (data-parallel replicas) and the MLP hidden units and
   attention heads over the mesh dimension that ``hidden`` / ``heads`` map to, each shard's
   weights on its device. Weight shards are kept once and read by every data replica; the
   replicas' gradient contributions are summed; the step is one ``tf.function``, whose
   graph keeps every shard's and replica's device. Split layers are Megatron's: the layout
   may split only ``batch``, ``hidden`` and ``heads``.
3. ``"dtensor"``: every Keras weight becomes a ``tf.experimental.dtensor`` DVariable whose
   layout the rules give (a dimension no rule names is replicated), the batch is laid out
   the same way, and the model's function runs on the DTensor mesh, where TensorFlow's SPMD
   expansion inserts the collectives. The training step is a ``tf.function`` (in TF 2.14
   DTensor's eager gradients of the loss fail to expand). It shares a process with mirrored
   strategies built by tensorfleet (``strategies.build("mirrored")``), which take collective
   keys of their own; in TF 2.14 DTensor's collectives and those of a
   ``tf.distribute.MirroredStrategy`` built directly take the same group key, and whichever
   runs second fails with "... is joining a group that is already full (group_key=1)".

All three train with plain SGD on the mean softmax cross-entropy of integer labels and, when
done, write the trained weights back into the Keras model. Supported models are chains of
``Dense``, ``GlobalAveragePooling1D`` and :class:`~tensorfleet.models.transformer.TransformerBlock`
layers (the ``digits_mlp`` and ``transformer_block`` models). Their tensor dimensions are
named ``batch``, ``seq``, ``features`` (the input), ``hidden`` (the output of a Dense that
feeds another Dense, and the block's MLP), ``hidden_2`` (a second hidden Dense in a row),
``d_model`` (the embedding), ``heads``, ``kv`` (per-head channels), ``memory_seq`` and
``classes``.

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

import dataclasses
import enum
import math
import time
from typing import Any, Mapping, Sequence

from tensorfleet.registry import Registry

__all__ = [
    "Mesh",
    "MeshBackend",
    "MeshHistory",
    "MeshLayout",
    "BACKENDS",
    "model_dimensions",
]


class MeshBackend(str, enum.Enum):
    """How a layout runs."""

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


@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """A Mesh-TF mesh shape and layout rules, parsed and checked.

    Args:
        mesh_shape: e.g. ``"b1:2;b2:2"``.
        layout: e.g. ``"batch:b1;hidden:b2"``; may be empty (everything replicated).

    Raises:
        ValueError: a string Mesh-TF cannot parse, a mesh dimension that is not positive, or
            a rule that names a mesh dimension the mesh does not have.

    Example:
        >>> layout = MeshLayout("b1:2;b2:2", "batch:b1;hidden:b2")
        >>> layout.mesh_dims, layout.rules, layout.size
        ({'b1': 2, 'b2': 2}, {'batch': 'b1', 'hidden': 'b2'}, 4)
    """

    mesh_shape: str
    layout: str = ""

    def __post_init__(self) -> None:
        from tensorfleet.model_parallel.mtf_compat import import_mesh_tensorflow

        if not isinstance(self.mesh_shape, str) or not self.mesh_shape.strip():
            raise ValueError('mesh_shape must be a non-empty string such as "b1:2;b2:2". '
                             f"Received: mesh_shape={self.mesh_shape!r}")
        if not isinstance(self.layout, str):
            raise ValueError(f'layout must be a string such as "batch:b1;hidden:b2". Received: layout={self.layout!r}')
        mtf = import_mesh_tensorflow()
        try:
            shape = mtf.convert_to_shape(self.mesh_shape)
        except Exception as exc:  # mesh-tensorflow raises bare ValueErrors without the input
            raise ValueError(f'mesh_shape must look like "b1:2;b2:2" (name:size pairs separated by ";"). '
                             f"Received: mesh_shape={self.mesh_shape!r} ({exc})") from None
        try:
            rules = mtf.convert_to_layout_rules(self.layout)
        except Exception as exc:
            raise ValueError(f'layout must look like "batch:b1;hidden:b2" (tensor_dim:mesh_dim pairs separated by ";"). '
                             f"Received: layout={self.layout!r} ({exc})") from None
        for dim in shape.dims:
            if dim.size <= 0:
                raise ValueError(f"Mesh dimension {dim.name!r} must have a positive size. Received: mesh_shape={self.mesh_shape!r}")
        names = [d.name for d in shape.dims]
        pairs = _rule_pairs(rules)
        for tensor_dim, mesh_dim in pairs:
            if [t for t, _ in pairs].count(tensor_dim) > 1:
                raise ValueError(f"Tensor dimension {tensor_dim!r} is laid out on more than one mesh dimension. "
                                 f"Received: layout={self.layout!r}")
            if mesh_dim not in names:
                raise ValueError(
                    f"Layout rule '{tensor_dim}:{mesh_dim}' names mesh dimension {mesh_dim!r}, which the mesh has not; "
                    f"mesh dimensions: {', '.join(names)}. Received: mesh_shape={self.mesh_shape!r}, layout={self.layout!r}")
        object.__setattr__(self, "_shape", shape)
        object.__setattr__(self, "_rules", rules)

    @property
    def mtf_shape(self) -> Any:
        """The ``mtf.Shape`` of the mesh."""
        return self._shape  # type: ignore[attr-defined]

    @property
    def mtf_rules(self) -> Any:
        """The ``mtf.LayoutRules``."""
        return self._rules  # type: ignore[attr-defined]

    @property
    def mesh_dims(self) -> dict[str, int]:
        """Mesh dimension name -> size, in mesh order."""
        return {d.name: d.size for d in self.mtf_shape.dims}

    @property
    def rules(self) -> dict[str, str]:
        """Tensor dimension name -> mesh dimension name."""
        return dict(_rule_pairs(self.mtf_rules))

    @property
    def size(self) -> int:
        """Number of devices the mesh needs."""
        return int(self.mtf_shape.size)

    def check(self, dims: Mapping[str, int], num_devices: int) -> None:
        """Checks the layout against a model's tensor dimensions and the devices at hand.

        Args:
            dims: tensor dimension name -> size (:func:`model_dimensions`).
            num_devices: devices available.

        Raises:
            ValueError: a rule names a tensor dimension the model has not, a mesh dimension
                does not divide the tensor dimension laid out on it, or the mesh needs more
                devices than there are.
        """
        if self.size > num_devices:
            raise ValueError(f"The mesh {self.mesh_shape!r} needs {self.size} devices but only {num_devices} are "
                             f"available; use a smaller mesh or more devices. Received: mesh_shape={self.mesh_shape!r}")
        for tensor_dim, mesh_dim in self.rules.items():
            if tensor_dim not in dims:
                raise ValueError(
                    f"Layout rule '{tensor_dim}:{mesh_dim}' names tensor dimension {tensor_dim!r}, which the model has "
                    f"not; its dimensions are: {', '.join(sorted(dims))}. Received: layout={self.layout!r}")
            size, parts = dims[tensor_dim], self.mesh_dims[mesh_dim]
            if size % parts != 0:
                raise ValueError(
                    f"Mesh dimension {mesh_dim!r} of size {parts} does not divide tensor dimension {tensor_dim!r} of size "
                    f"{size}; choose a mesh size that divides {size}. Received: mesh_shape={self.mesh_shape!r}, "
                    f"layout={self.layout!r}")

    def coordinates(self, pnum: int) -> dict[str, int]:
        """Mesh coordinates of processor ``pnum`` (row-major, as PlacementMeshImpl numbers them)."""
        coords, rest = {}, pnum
        for name, size in reversed(list(self.mesh_dims.items())):
            coords[name], rest = rest % size, rest // size
        return dict(reversed(list(coords.items())))


def _rule_pairs(rules: Any) -> list[tuple[str, str]]:
    # mtf.LayoutRules keeps its (tensor_dim, mesh_dim) pairs in a set with no public accessor.
    return sorted(rules._pairs)


# ---------------------------------------------------------------------------------------------
# The supported model vocabulary: a chain of layers, each described once for both backends.


@dataclasses.dataclass
class _Step:
    kind: str  # "dense" | "block" | "pool"
    layer: Any
    out_dim: str = ""


def _chain(model: Any) -> list[_Step]:
    import tensorflow as tf

    from tensorfleet.models.transformer import TransformerBlock
    from tensorfleet.model_parallel.pipeline import _chain_layers

    layers = _chain_layers(model)
    if len(model.inputs[0].shape) not in (2, 3):
        raise ValueError(f"Mesh layouts support inputs of shape (batch, features) or (batch, seq, features). "
                         f"Received: input shape {tuple(model.inputs[0].shape)}")
    steps: list[_Step] = []
    hidden_names = ("hidden", "hidden_2")
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        if isinstance(layer, tf.keras.layers.Dense):
            if layer.activation.__name__ not in _ACTIVATIONS:
                raise ValueError(f"Mesh layouts support Dense activations {sorted(_ACTIVATIONS)}. "
                                 f"Received: layer {layer.name!r} with activation {layer.activation.__name__!r}")
            nxt = layers[i + 1] if not last else None
            if last:
                out = "classes"
            elif isinstance(nxt, TransformerBlock):
                out = "d_model"
            elif steps and steps[-1].out_dim in hidden_names and steps[-1].kind == "dense":
                out = hidden_names[1 - hidden_names.index(steps[-1].out_dim)]
            else:
                out = "hidden"
            steps.append(_Step("dense", layer, out))
        elif isinstance(layer, TransformerBlock):
            steps.append(_Step("block", layer, "d_model"))
        elif isinstance(layer, tf.keras.layers.GlobalAveragePooling1D):
            steps.append(_Step("pool", layer))
        else:
            raise ValueError(f"Mesh layouts support Dense, GlobalAveragePooling1D and TransformerBlock layers. "
                             f"Received: layer {layer.name!r} of type {type(layer).__name__}")
    if steps[-1].kind != "dense":
        raise ValueError(f"The model must end in a Dense layer that outputs class logits. Received: last layer "
                         f"{layers[-1].name!r}")
    return steps


_ACTIVATIONS = {"linear", "relu", "tanh", "sigmoid"}


def model_dimensions(model: Any, batch_size: int) -> dict[str, int]:
    """Names and sizes of the tensor dimensions of a supported Keras model (see module docstring).

    Example:
        >>> import tensorfleet as tfl
        >>> model_dimensions(tfl.models.build("digits_mlp"), 32)
        {'batch': 32, 'features': 64, 'hidden': 64, 'classes': 10}
    """
    shape = model.inputs[0].shape
    dims = {"batch": batch_size}
    if len(shape) == 3:
        dims["seq"] = int(shape[1])
        dims["memory_seq"] = int(shape[1])
    dims["features"] = int(shape[-1])
    for step in _chain(model):
        if step.kind == "dense":
            dims[step.out_dim] = int(step.layer.units)
        elif step.kind == "block":
            block = step.layer
            dims.update(heads=block.num_heads, kv=block.key_dim, hidden=block.hidden)
    return dims


# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class MeshHistory:
    """What :meth:`Mesh.fit` returns: per-epoch mean loss and every step's loss."""

    loss: list[float]
    step_loss: list[float]
    backend: str
    devices: list[str]
    placement: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per device: graph ops placed there (mtf: the lowered graph; keras: the traced training
    step) or weight elements held there (dtensor)."""
    grid: list[list[str]] = dataclasses.field(default_factory=list)
    """keras backend: the devices as [data replica][model shard]; each replica computes on its row."""
    weights: dict[str, Any] = dataclasses.field(default_factory=dict)
    """:meth:`Mesh.fit_mtf`: the trained value of every Mesh-TF variable, by name."""
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    """Wall time of each training step (the first includes tracing or session warm-up)."""


class Mesh:
    """A device mesh with a Mesh-TF layout, and the way it trains a Keras model.

    Args:
        mesh_shape: Mesh-TF mesh shape, e.g. ``"b1:2;b2:2"``.
        layout: Mesh-TF layout rules, e.g. ``"batch:b1;hidden:b2"``.
        backend: ``"mtf"`` (Mesh-TensorFlow graph), ``"keras"`` (tensor-parallel Keras layers)
            or ``"dtensor"`` (DTensor DVariables).
        devices: device names; default: the logical CPU devices (or GPUs, where present).

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
                 devices: Sequence[str] | None = None) -> None:
        self.layout = MeshLayout(mesh_shape, layout)
        self.backend = BACKENDS.get(backend.value if isinstance(backend, MeshBackend) else backend)
        self._devices = list(devices) if devices is not None else None

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
            model: a built Keras model of the supported kind (see module docstring).
            x: inputs, ``(n, features)`` or ``(n, seq, features)``.
            y: integer class labels, ``(n,)``.
            epochs: passes over the data.
            batch_size: global batch size (split over the ``batch`` mesh dimension).
            learning_rate: SGD step size.
            verbose: show a progress bar.

        Returns:
            A :class:`MeshHistory` with per-epoch and per-step losses.
        """
        x, y, batches = _batches(x, y, epochs, batch_size, learning_rate)
        dims = self.check(model, batch_size)
        runner = {MeshBackend.MTF: _fit_mtf, MeshBackend.KERAS: _fit_keras, MeshBackend.DTENSOR: _fit_dtensor}[self.backend]
        timings: list[float] = []
        step_loss, placement, grid = runner(self, model, dims, batches, epochs, learning_rate, verbose, timings)
        return MeshHistory(loss=_epoch_means(step_loss, epochs), step_loss=step_loss, backend=self.backend.value,
                           devices=self.devices, placement=placement, grid=grid, step_seconds=timings)

    def fit_mtf(self, model_fn: Any, x: Any, y: Any, *, dims: Mapping[str, int], epochs: int = 1,
                batch_size: int = 32, learning_rate: float = 0.1, seed: int | None = 0,
                verbose: bool = True) -> MeshHistory:
        """Trains a model written with Mesh-TF layers under the layout (always the mtf backend).

        Args:
            model_fn: ``model_fn(mtf, mesh, inputs, dims) -> logits``: builds the model with
                ``mtf`` (the mesh-tensorflow module, already import-fixed) on ``mesh`` from
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
        x, y, batches = _batches(x, y, epochs, batch_size, learning_rate)
        if not isinstance(dims, Mapping) or "classes" not in dims:
            raise ValueError(f"dims must map dimension names to sizes and include 'classes'. Received: dims={dims!r}")
        full = {"batch": batch_size}
        if x.ndim == 3:
            full.update(seq=int(x.shape[1]), memory_seq=int(x.shape[1]))
        full["features"] = int(x.shape[-1])
        for name, size in dims.items():
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ValueError(f"Each dimension size must be a positive integer. Received: dims[{name!r}]={size!r}")
            full[name] = size
        self.layout.check(full, len(self.devices))

        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable as model_fn(mtf, mesh, inputs, dims). Received: {model_fn!r}")
        timings: list[float] = []
        step_loss, placement, trained = _run_mtf(self, model_fn, full, batches, epochs, learning_rate, verbose, seed,
                                                 timings)
        return MeshHistory(loss=_epoch_means(step_loss, epochs), step_loss=step_loss, backend=MeshBackend.MTF.value,
                           devices=self.devices, placement=placement, weights=trained, step_seconds=timings)


def _epoch_means(step_loss: list[float], epochs: int) -> list[float]:
    per_epoch = len(step_loss) // epochs
    return [sum(step_loss[e * per_epoch:(e + 1) * per_epoch]) / per_epoch for e in range(epochs)]


def _batches(x: Any, y: Any, epochs: int, batch_size: int, learning_rate: float) -> tuple[Any, Any, list]:
    """Validates the training arguments; returns x, y as arrays and the full batches in order."""
    import numpy as np

    for key, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{key} must be a positive integer. Received: {key}={value!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be positive. Received: learning_rate={learning_rate!r}")
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int32)
    if len(x) != len(y):
        raise ValueError(f"x and y must hold the same number of examples. Received: {len(x)} and {len(y)}")
    if len(x) < batch_size:
        raise ValueError(f"batch_size must be at most the number of examples ({len(x)}). "
                         f"Received: batch_size={batch_size}")
    batches = [(x[s:s + batch_size], y[s:s + batch_size]) for s in range(0, len(x) - batch_size + 1, batch_size)]
    return x, y, batches


class _StepBar:
    """A tqdm bar whose ``update`` also records the wall time of each step."""

    def __init__(self, total: int, verbose: bool, desc: str, timings: list[float]) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc=desc, disable=not verbose, leave=False)
        self._timings = timings
        self._last = time.perf_counter()

    def __enter__(self) -> "_StepBar":
        self._last = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.close()

    def update(self, n: int = 1) -> None:
        now = time.perf_counter()
        self._timings.append(now - self._last)
        self._last = now
        self._bar.update(n)

    def set_postfix(self, **kwargs: Any) -> None:
        self._bar.set_postfix(**kwargs)


def _progress(total: int, verbose: bool, desc: str, timings: list[float]) -> _StepBar:
    return _StepBar(total, verbose, desc, timings)


# ---------------------------------------------------------------------------------------------
# Backend 1: Mesh-TensorFlow.


def _fit_mtf(mesh_obj: Mesh, model: Any, dims: dict[str, int], batches: list, epochs: int, lr: float,
             verbose: bool, timings: list[float]) -> tuple[list[float], dict[str, int], list[list[str]]]:
    import numpy as np
    import tensorflow as tf

    steps = _chain(model)
    snapshot = {v.ref(): v.numpy() for v in model.weights}  # Keras weights are eager; read them before the graph
    sources: dict[str, Any] = {}  # mtf variable name -> the Keras variable it starts from

    def build(mtf: Any, mesh: Any, h: Any, dim: dict[str, Any]) -> Any:
        def variable(name: str, shape: list, source: Any) -> Any:
            initializer = tf.compat.v1.constant_initializer(snapshot[source.ref()])
            tensor = mtf.get_variable(mesh, name, mtf.Shape(shape), initializer=initializer)
            sources[tensor.operation.name] = source
            return tensor

        for index, step in enumerate(steps):
            if step.kind == "dense":
                layer, in_dim, out_dim = step.layer, h.shape.dims[-1], dim[step.out_dim]
                w = variable(f"l{index}_kernel", [in_dim, out_dim], layer.kernel)
                h = mtf.einsum([h, w], output_shape=h.shape.dims[:-1] + [out_dim])
                if layer.use_bias:
                    h = h + variable(f"l{index}_bias", [out_dim], layer.bias)
                h = _mtf_activation(mtf, layer.activation.__name__, h)
            elif step.kind == "pool":
                h = mtf.reduce_mean(h, reduced_dim=dim["seq"])
            else:
                h = _mtf_block(mtf, h, step.layer, dim, lambda n, s, src, i=index: variable(f"l{i}_{n}", s, src))
        return h

    losses, placement, trained = _run_mtf(mesh_obj, build, dims, batches, epochs, lr, verbose, None, timings)
    for name, source in sources.items():
        source.assign(np.asarray(trained[name]).reshape(source.shape))
    return losses, placement, []


def _run_mtf(mesh_obj: Mesh, build: Any, dims: dict[str, int], batches: list, epochs: int, lr: float,
             verbose: bool, seed: int | None, timings: list[float]) -> tuple[list[float], dict[str, int], dict[str, Any]]:
    """Builds ``build(mtf, mesh, inputs, dims) -> logits`` in its own graph, lowers it onto the
    mesh with PlacementMeshImpl and trains it with SGD; returns the step losses, the op count
    per device and the trained value of every Mesh-TF variable by name."""
    import tensorflow as tf

    from tensorfleet.model_parallel.mtf_compat import import_mesh_tensorflow

    mtf = import_mesh_tensorflow()
    batch_size = dims["batch"]
    graph = tf.Graph()
    with graph.as_default():
        if seed is not None:
            tf.compat.v1.set_random_seed(seed)
        mesh_graph = mtf.Graph()
        mesh = mtf.Mesh(mesh_graph, "tensorfleet_mesh")
        dim = {name: mtf.Dimension(name, size) for name, size in dims.items()}
        x_shape = (batch_size,) + tuple(batches[0][0].shape[1:])
        x_ph = tf.compat.v1.placeholder(tf.float32, x_shape, name="x")
        y_ph = tf.compat.v1.placeholder(tf.int32, (batch_size,), name="y")
        in_dims = [dim["batch"], dim["seq"], dim["features"]] if len(x_shape) == 3 else [dim["batch"], dim["features"]]
        inputs = mtf.import_tf_tensor(mesh, x_ph, mtf.Shape(in_dims))
        labels = mtf.import_tf_tensor(mesh, y_ph, mtf.Shape([dim["batch"]]))
        logits = build(mtf, mesh, inputs, dim)
        if "classes" not in [d.name for d in logits.shape.dims]:
            raise ValueError(f"The Mesh-TF model must return logits with a 'classes' dimension. "
                             f"Received: logits of shape {logits.shape}")
        loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(logits, labels, dim["classes"]))
        trainable = mesh_graph.trainable_variables
        grads = mtf.gradients([loss], [v.outputs[0] for v in trainable])
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_obj.layout.mtf_shape, mesh_obj.layout.mtf_rules,
                                                         mesh_obj.devices)
        lowering = mtf.Lowering(mesh_graph, {mesh: impl}, autostack=False)  # keep one laid-out variable each
        tf_loss = lowering.export_to_tf_tensor(loss)
        # SGD on the slice variables, after every gradient slice and the loss exist. Mesh-TF
        # lowers a variable read to the slice variables themselves, so each consumer reads them
        # anew; with mtf's own Assign ops nothing orders a backward-pass read of one variable
        # before another variable's update, and a step can see half-updated weights.
        grad_slices = [lowering.tensors[g].to_laid_out_tensor().all_slices for g in grads]
        updates = []
        with tf.control_dependencies([t for slices in grad_slices for t in slices] + [tf_loss]):
            for var, slices in zip(trainable, grad_slices):
                for var_slice, grad_slice in zip(lowering.variables[var].laid_out_tensor.all_slices, slices):
                    with tf.device(var_slice.device):
                        updates.append(var_slice.assign_sub(lr * grad_slice))
        tf_update = tf.group(updates)
        init = tf.compat.v1.global_variables_initializer()
        to_slices = lowering.copy_masters_to_slices()
        to_masters = lowering.copy_slices_to_masters()
        variables = mesh_graph.all_variables
        masters = [v.get_master() for v in variables]
        placement = _count_devices(op.device for op in graph.get_operations() if op.device)
        losses: list[float] = []
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            session.run(to_slices)
            with _progress(epochs * len(batches), verbose, f"mesh {mesh_obj.layout.mesh_shape} (mtf)",
                           timings) as bar:
                for _ in range(epochs):
                    for xb, yb in batches:
                        value, _ = session.run([tf_loss, tf_update], feed_dict={x_ph: xb, y_ph: yb})
                        losses.append(float(value))
                        bar.update(1)
                        bar.set_postfix(loss=f"{losses[-1]:.4f}")
            session.run(to_masters)
            trained = dict(zip([v.name for v in variables], session.run(masters)))
    return losses, placement, trained


def _count_devices(names: Any) -> dict[str, int]:
    import tensorflow as tf

    counts: dict[str, int] = {}
    for name in names:
        spec = tf.DeviceSpec.from_string(name)
        key = f"/device:{spec.device_type}:{spec.device_index}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _mtf_activation(mtf: Any, name: str, h: Any) -> Any:
    if name == "relu":
        return mtf.relu(h)
    if name == "tanh":
        return mtf.tanh(h)
    if name == "sigmoid":
        return mtf.sigmoid(h)
    return h


def _mtf_block(mtf: Any, x: Any, block: Any, dim: dict[str, Any], variable: Any) -> Any:
    # The function of TransformerBlock (Keras MultiHeadAttention as self-attention, then the
    # MLP, each with a residual), written with mtf.einsum so that Mesh-TF can split heads and
    # hidden units.
    attention = block.attention
    batch, seq, d_model = dim["batch"], dim["seq"], dim["d_model"]
    heads, kv, memory = dim["heads"], dim["kv"], dim["memory_seq"]
    memory_x = mtf.rename_dimension(x, "seq", "memory_seq")
    projections = {}
    for name, dense, source, length in (("query", attention._query_dense, x, seq),
                                        ("key", attention._key_dense, memory_x, memory),
                                        ("value", attention._value_dense, memory_x, memory)):
        w = variable(f"{name}_kernel", [d_model, heads, kv], dense.kernel)
        t = mtf.einsum([source, w], output_shape=[batch, length, heads, kv])
        if attention._use_bias:
            t = t + variable(f"{name}_bias", [heads, kv], dense.bias)
        projections[name] = t
    q = projections["query"] * (1.0 / math.sqrt(float(dim["kv"].size)))
    scores = mtf.einsum([q, projections["key"]], output_shape=[batch, heads, seq, memory])
    probs = mtf.softmax(scores, memory)
    context = mtf.einsum([probs, projections["value"]], output_shape=[batch, seq, heads, kv])
    wo = variable("output_kernel", [heads, kv, d_model], attention._output_dense.kernel)
    out = mtf.einsum([context, wo], output_shape=[batch, seq, d_model])
    if attention._use_bias:
        out = out + variable("output_bias", [d_model], attention._output_dense.bias)
    h = x + out
    w1 = variable("mlp_in_kernel", [d_model, dim["hidden"]], block.dense1.kernel)
    m = mtf.relu(mtf.einsum([h, w1], output_shape=[batch, seq, dim["hidden"]]) +
                 variable("mlp_in_bias", [dim["hidden"]], block.dense1.bias))
    w2 = variable("mlp_out_kernel", [dim["hidden"], d_model], block.dense2.kernel)
    m = mtf.einsum([m, w2], output_shape=[batch, seq, d_model]) + variable("mlp_out_bias", [d_model], block.dense2.bias)
    return h + m


# ---------------------------------------------------------------------------------------------
# Backend 2: Keras with tensor-parallel layers.


def _mesh_grid(mesh_obj: Mesh, dims: dict[str, int]) -> tuple[list[list[str]], str | None]:
    """Devices as [data replica][model shard], and the mesh dimension used as the model axis."""
    layout, devices = mesh_obj.layout, mesh_obj.devices
    rules = layout.rules
    unsupported = sorted(set(rules) - {"batch", "hidden", "heads"})
    if unsupported:
        raise ValueError(f"The keras mesh backend splits only the batch, hidden and heads dimensions. Received: "
                         f"layout rule(s) for {', '.join(unsupported)} in layout={layout.layout!r}; use backend='mtf'")
    data_axis = rules.get("batch")
    model_axes = {rules[d] for d in ("hidden", "heads") if d in rules}
    if len(model_axes) > 1:
        raise ValueError(f"The keras mesh backend needs hidden and heads on the same mesh dimension. "
                         f"Received: layout={layout.layout!r}")
    model_axis = next(iter(model_axes), None)
    if model_axis is not None and model_axis == data_axis:
        raise ValueError(f"batch and the model dimensions must be on different mesh dimensions. "
                         f"Received: layout={layout.layout!r}")
    n_data = layout.mesh_dims[data_axis] if data_axis else 1
    n_model = layout.mesh_dims[model_axis] if model_axis else 1
    grid = [[""] * n_model for _ in range(n_data)]
    for pnum, device in enumerate(devices):
        coords = layout.coordinates(pnum)
        others = [c for name, c in coords.items() if name not in (data_axis, model_axis)]
        if any(others):
            continue  # mesh dimensions that no rule uses replicate; the first slice does the work
        grid[coords[data_axis] if data_axis else 0][coords[model_axis] if model_axis else 0] = device
    return grid, model_axis


def _fit_keras(mesh_obj: Mesh, model: Any, dims: dict[str, int], batches: list, epochs: int, lr: float,
               verbose: bool, timings: list[float]) -> tuple[list[float], dict[str, int], list[list[str]]]:
    import tensorflow as tf

    from tensorfleet.model_parallel import tensor_parallel as tp

    grid, model_axis = _mesh_grid(mesh_obj, dims)
    shard_devices = grid[0]
    steps = _chain(model)
    rules = mesh_obj.layout.rules
    # Build the executable chain: tensor-parallel stand-ins where the layout splits something.
    chain: list[tuple[str, Any]] = []
    write_back: list[tuple[Any, Any]] = []
    i = 0
    while i < len(steps):
        step = steps[i]
        split_hidden = "hidden" in rules and model_axis is not None
        if (step.kind == "dense" and step.out_dim == "hidden" and split_hidden and i + 1 < len(steps)
                and steps[i + 1].kind == "dense"):
            second = steps[i + 1].layer
            if second.activation.__name__ != "linear":
                raise ValueError(f"A split MLP's second Dense is row-parallel and must be linear in the keras backend. "
                                 f"Received: layer {second.name!r} with activation {second.activation.__name__!r}")
            mlp = tp.ParallelMLP.from_dense(step.layer, second, devices=shard_devices)
            chain.append(("parallel", mlp))
            write_back.append((mlp, (step.layer, second)))
            i += 2
            continue
        if step.kind == "block" and model_axis is not None and ("hidden" in rules or "heads" in rules):
            block = tp.ParallelTransformerBlock.from_block(
                step.layer, devices=shard_devices if "hidden" in rules else shard_devices[:1],
                heads_devices=shard_devices if "heads" in rules else shard_devices[:1])
            chain.append(("parallel", block))
            write_back.append((block, step.layer))
        else:
            chain.append(("plain", step.layer))
        i += 1
    variables = [v for kind, layer in chain for v in layer.trainable_variables]
    optimizer = tf.keras.optimizers.SGD(lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def forward(xb: Any, row: list[str]) -> Any:
        h = xb
        for kind, layer in chain:
            if kind == "parallel":
                with tp.compute_on(row[: len(layer.devices)]):
                    h = layer(h)
            else:
                with tf.device(row[0]):
                    h = layer(h)
        return h

    n = len(batches[0][0])
    bounds = [round(r * n / len(grid)) for r in range(len(grid) + 1)]

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        # Traced once: the device placements of every shard and replica are kept in the graph.
        with tf.GradientTape() as tape:
            parts = []
            for r, row in enumerate(grid):
                a, b = bounds[r], bounds[r + 1]
                with tf.device(row[0]):
                    logits = forward(xb[a:b], row)
                    parts.append(loss_fn(yb[a:b], logits) * ((b - a) / n))
            with tf.device(grid[0][0]):
                loss = tf.add_n(parts)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses: list[float] = []
    with _progress(epochs * len(batches), verbose, f"mesh {mesh_obj.layout.mesh_shape} (keras)",
                   timings) as bar:
        for _ in range(epochs):
            for xb, yb in batches:
                losses.append(float(train_step(tf.constant(xb), tf.constant(yb))))
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
    _write_back(write_back)
    graph = train_step.get_concrete_function(tf.constant(batches[0][0]), tf.constant(batches[0][1])).graph
    return losses, _count_devices(op.device for op in graph.get_operations() if op.device), grid


def _write_back(pairs: list[tuple[Any, Any]]) -> None:
    import numpy as np

    from tensorfleet.model_parallel import tensor_parallel as tp

    def mlp_back(mlp: Any, first: Any, second: Any) -> None:
        first.kernel.assign(np.concatenate([k.numpy() for k in mlp.column.kernels], axis=1))
        if first.use_bias:
            first.bias.assign(np.concatenate([b.numpy() for b in mlp.column.biases]))
        second.kernel.assign(np.concatenate([k.numpy() for k in mlp.row.kernels], axis=0))
        if second.use_bias:
            second.bias.assign(mlp.row.bias.numpy())

    for parallel, original in pairs:
        if isinstance(parallel, tp.ParallelMLP):
            mlp_back(parallel, *original)
            continue
        mlp_back(parallel.mlp, original.dense1, original.dense2)
        attention, source = parallel.attention, original.attention
        for name, dense in (("query", source._query_dense), ("key", source._key_dense), ("value", source._value_dense)):
            dense.kernel.assign(np.concatenate([s[f"{name}_kernel"].numpy() for s in attention.shards], axis=1))
            if attention.use_bias:
                dense.bias.assign(np.concatenate([s[f"{name}_bias"].numpy() for s in attention.shards], axis=0))
        source._output_dense.kernel.assign(np.concatenate([s["output_kernel"].numpy() for s in attention.shards], axis=0))
        if attention.use_bias:
            source._output_dense.bias.assign(attention.output_bias.numpy())


# ---------------------------------------------------------------------------------------------
# Backend 3: DTensor.


def _fit_dtensor(mesh_obj: Mesh, model: Any, dims: dict[str, int], batches: list, epochs: int, lr: float,
                 verbose: bool, timings: list[float]) -> tuple[list[float], dict[str, int], list[list[str]]]:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    steps = _chain(model)
    rules = mesh_obj.layout.rules
    mesh = dtensor.create_mesh(list(mesh_obj.layout.mesh_dims.items()), devices=mesh_obj.devices)

    def layout(*names: str) -> Any:
        return dtensor.Layout([rules.get(n, dtensor.UNSHARDED) for n in names], mesh)

    def put(value: Any, target: Any) -> Any:
        return dtensor.relayout(dtensor.copy_to_mesh(value, dtensor.Layout.replicated(mesh, rank=target.rank)), target)

    # Each Keras weight becomes a DVariable laid out by the rules for its tensor dimensions.
    named: list[tuple[Any, tuple[str, ...]]] = []
    previous = "features"
    for step in steps:
        if step.kind == "dense":
            named += [(step.layer.kernel, (previous, step.out_dim))]
            if step.layer.use_bias:
                named += [(step.layer.bias, (step.out_dim,))]
            previous = step.out_dim
        elif step.kind == "block":
            attention, block = step.layer.attention, step.layer
            for dense in (attention._query_dense, attention._key_dense, attention._value_dense):
                named += [(dense.kernel, ("d_model", "heads", "kv"))]
                if attention._use_bias:
                    named += [(dense.bias, ("heads", "kv"))]
            named += [(attention._output_dense.kernel, ("heads", "kv", "d_model"))]
            if attention._use_bias:
                named += [(attention._output_dense.bias, ("d_model",))]
            named += [(block.dense1.kernel, ("d_model", "hidden")), (block.dense1.bias, ("hidden",)),
                      (block.dense2.kernel, ("hidden", "d_model")), (block.dense2.bias, ("d_model",))]
    dvars = {source.ref(): dtensor.DVariable(put(source.numpy(), layout(*names))) for source, names in named}
    variables = list(dvars.values())

    def w(source: Any) -> Any:
        return dvars[source.ref()]

    def forward(h: Any) -> Any:
        for step in steps:
            if step.kind == "dense":
                layer = step.layer
                h = tf.einsum("bsi,io->bso" if h.shape.rank == 3 else "bi,io->bo", h, w(layer.kernel))
                if layer.use_bias:
                    h = h + w(layer.bias)
                h = layer.activation(h)
            elif step.kind == "pool":
                h = tf.reduce_mean(h, axis=1)
            else:
                block, attention = step.layer, step.layer.attention
                q, k, v = (tf.einsum("bsd,dhk->bshk", h, w(d.kernel)) + (w(d.bias) if attention._use_bias else 0.0)
                           for d in (attention._query_dense, attention._key_dense, attention._value_dense))
                q = q * (1.0 / math.sqrt(float(block.key_dim)))
                scores = tf.nn.softmax(tf.einsum("btnh,bsnh->bnst", k, q), axis=-1)
                out = tf.einsum("bsnh,nhd->bsd", tf.einsum("bnst,btnh->bsnh", scores, v),
                                w(attention._output_dense.kernel))
                if attention._use_bias:
                    out = out + w(attention._output_dense.bias)
                h = h + out
                m = tf.nn.relu(tf.einsum("bsd,df->bsf", h, w(block.dense1.kernel)) + w(block.dense1.bias))
                h = h + tf.einsum("bsf,fd->bsd", m, w(block.dense2.kernel)) + w(block.dense2.bias)
        return h

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        # DTensor's eager gradients of the loss do not expand to DTensors in TF 2.14; a traced step does.
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, forward(xb)))
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(lr * grad)
        return loss

    x_layout = layout("batch", "seq", "features") if batches[0][0].ndim == 3 else layout("batch", "features")
    y_layout = layout("batch")
    losses: list[float] = []
    with _progress(epochs * len(batches), verbose, f"mesh {mesh_obj.layout.mesh_shape} (dtensor)",
                   timings) as bar:
        for _ in range(epochs):
            for xb, yb in batches:
                loss = train_step(put(xb, x_layout), put(yb, y_layout))
                losses.append(float(dtensor.unpack(loss)[0].numpy()))
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
    placement: dict[str, int] = {}
    for (source, _), variable in zip(named, variables):
        for component in dtensor.unpack(variable.read_value()):
            key = _count_devices([component.device]).popitem()[0]
            placement[key] = placement.get(key, 0) + int(component.shape.num_elements())
        whole = dtensor.relayout(variable.read_value(), dtensor.Layout.replicated(mesh, rank=len(source.shape)))
        source.assign(dtensor.unpack(whole)[0].numpy())
    return losses, dict(sorted(placement.items())), []
