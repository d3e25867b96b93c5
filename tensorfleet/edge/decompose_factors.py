"""The factored forms of one layer, as plain Keras layers with their weights.

* ``svd`` (Denton et al., 2014): a Dense kernel ``W (in, out) = U S V^T`` truncated to rank ``r``
  becomes two Dense layers, ``in -> r`` (no bias) and ``r -> out`` (the bias and activation);
  a 1x1 Conv2D becomes two 1x1 Conv2D the same way.
* ``tucker2`` (Kim et al., 2016): a Conv2D kernel ``K (kh, kw, cin, cout)`` is a core
  ``(kh, kw, r_in, r_out)`` times a factor on each channel mode (TensorLy ``partial_tucker``):
  1x1 Conv2D ``cin -> r_in``, the kh x kw core with the layer's strides, padding and
  dilation, 1x1 Conv2D ``r_out -> cout`` with the bias and activation.
* ``cp`` (Lebedev et al., 2015): ``K = sum_r A[:, r] o B[:, r] o C[:, r] o D[:, r]`` (TensorLy
  ``parafac``): 1x1 Conv2D ``cin -> r``, a kh x 1 and a 1 x kw DepthwiseConv2D (each carrying the
  layer's stride, padding and dilation along its own axis, which is exact because TensorFlow pads
  each axis on its own), 1x1 Conv2D ``r -> cout`` with the bias and activation. At the full rank
  (the smallest product of three of the kernel's four sizes) the factors are the exact
  decomposition into unit vectors, not an ALS fit.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorfleet.compat.keras import module_of

__all__ = ["Factor", "layer_kind", "kernel_of", "svd_factors", "tucker2_factors", "cp_factors", "cp_full_rank",
           "fit_cp", "layer_macs", "weight_kernel",
           "svd_kernel", "tucker2_kernel", "cp_kernel"]


@dataclass(frozen=True)
class Factor:
    """One layer of a factored form: its Keras serialization, weights, parameters and MACs per example."""

    config: dict[str, Any]
    weights: tuple[np.ndarray, ...]
    params: int
    macs: int


def _keras(layer: Any) -> Any:
    """The Keras module ``layer`` belongs to: its factors are built there."""
    return module_of(layer, "tfl.edge.decompose", "layer")


def layer_kind(layer: Any) -> str | None:
    """``"dense"``, ``"conv"`` (kh x kw), ``"conv1x1"``, or None for a layer no method factors."""
    try:
        keras = _keras(layer)
    except TypeError:  # not a Keras layer at all: nothing to factor
        return None
    if type(layer) is keras.layers.Dense:
        return "dense"
    if type(layer) is keras.layers.Conv2D:
        return "conv1x1" if tuple(layer.kernel_size) == (1, 1) else "conv"
    return None


def kernel_of(layer: Any) -> np.ndarray:
    """The layer's kernel in float64."""
    return np.asarray(layer.kernel.numpy(), np.float64)


def _shape(layer: Any, which: str) -> tuple[Any, ...]:
    """``layer``'s input or output shape: tf_keras has ``input_shape``/``output_shape``, Keras 3 the shapes of
    its symbolic ``input``/``output``."""
    if hasattr(layer, f"{which}_shape"):
        return tuple(getattr(layer, f"{which}_shape"))
    return tuple(getattr(layer, which).shape)


def _positions(shape: Any) -> int:
    """Output positions of one example: the product of the sizes between batch and channels."""
    dims = [d for d in tuple(shape)[1:-1] if d is not None]
    return int(math.prod(dims)) if dims else 1


def weight_kernel(layer: Any) -> Any:
    """The layer's ``kernel`` or ``depthwise_kernel`` variable, or None."""
    for name in ("kernel", "depthwise_kernel"):
        weight = getattr(layer, name, None)
        if weight is not None and hasattr(weight, "shape"):
            return weight
    return None


def layer_macs(layer: Any) -> int:
    """Multiply-accumulates of one example in a Dense, Conv2D or DepthwiseConv2D layer: each output
    position multiplies every entry of the kernel once."""
    return _positions(_shape(layer, "output")) * int(math.prod(weight_kernel(layer).shape))


def _serialize(cls: Any, config: dict[str, Any]) -> dict[str, Any]:
    layer = cls.from_config(config)
    return _keras(layer).layers.serialize(layer)


def _factor(layer: Any, name: str, last: bool, weights: list[np.ndarray], macs: int, **changes: Any) -> Factor:
    """A copy of ``layer``'s config with ``changes``; only the last factor keeps bias and activation."""
    config = dict(layer.get_config(), name=name, **changes)
    if not last:
        config.update(use_bias=False, activation="linear", activity_regularizer=None, bias_regularizer=None,
                      bias_constraint=None)
    dtype = _dtype(layer)
    arrays = [np.asarray(w, dtype) for w in weights]
    if last and layer.use_bias:
        arrays.append(np.asarray(layer.bias.numpy(), dtype))
    return Factor(_serialize(type(layer), config), tuple(arrays), int(sum(a.size for a in arrays)), int(macs))


def _dtype(layer: Any) -> np.dtype:
    """The NumPy dtype of ``layer``'s kernel (tf_keras: a ``tf.DType``, Keras 3: a name)."""
    dtype = layer.kernel.dtype
    return np.dtype(getattr(dtype, "as_numpy_dtype", dtype))


def _split(matrix: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    u, s, vt = np.linalg.svd(matrix, full_matrices=False)
    root = np.sqrt(s[:rank])
    return u[:, :rank] * root, root[:, None] * vt[:rank]


def svd_factors(layer: Any, rank: int) -> list[Factor]:
    """Two Dense (or two 1x1 Conv2D) layers of rank ``rank``."""
    kernel = kernel_of(layer)
    if layer_kind(layer) == "dense":
        first, second = _split(kernel, rank)
        positions = _positions(_shape(layer, "output"))
        return [_factor(layer, f"{layer.name}_u", False, [first], positions * first.size, units=rank),
                _factor(layer, f"{layer.name}_v", True, [second], positions * second.size)]
    first, second = _split(kernel[0, 0], rank)
    positions = _positions(_shape(layer, "output"))  # the first factor carries the stride, so both run at the output's
    return [_factor(layer, f"{layer.name}_u", False, [first[None, None]], positions * first.size, filters=rank),
            _factor(layer, f"{layer.name}_v", True, [second[None, None]], positions * second.size,
                    strides=(1, 1), padding="valid")]


def _numpy_backend() -> Any:
    import tensorly as tl

    return tl.backend_context("numpy")


def tucker2_factors(layer: Any, rank: tuple[int, int]) -> list[Factor]:
    """1x1 Conv2D, the kh x kw core, 1x1 Conv2D (TensorLy ``partial_tucker`` on the channel modes)."""
    from tensorly.decomposition import partial_tucker

    kernel = kernel_of(layer)
    kh, kw, cin, cout = kernel.shape
    r_in, r_out = rank
    with _numpy_backend(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TensorLy caps the SVD's vectors at the matrix's size
        (core, (u_in, u_out)), _ = partial_tucker(kernel, rank=[r_in, r_out], modes=[2, 3], init="svd",
                                                  random_state=0)
    core, u_in, u_out = np.asarray(core), np.asarray(u_in), np.asarray(u_out)
    inside, outside = _positions(_shape(layer, "input")), _positions(_shape(layer, "output"))
    one = {"kernel_size": (1, 1), "strides": (1, 1), "padding": "valid", "dilation_rate": (1, 1)}
    return [_factor(layer, f"{layer.name}_in", False, [u_in[None, None]], inside * cin * r_in, filters=r_in, **one),
            _factor(layer, f"{layer.name}_core", False, [core], outside * kh * kw * r_in * r_out, filters=r_out),
            _factor(layer, f"{layer.name}_out", True, [u_out.T[None, None]], outside * r_out * cout, **one)]


def cp_full_rank(shape: tuple[int, ...]) -> int:
    """The rank at which a CP decomposition of a 4-D kernel is exact by construction."""
    total = int(math.prod(shape))
    return min(total // int(d) for d in shape)


def _exact_cp(kernel: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Unit vectors on three modes, the kernel's fibres on the largest: exact at :func:`cp_full_rank`."""
    dims = kernel.shape
    free = int(np.argmax(dims))
    others = [i for i in range(4) if i != free]
    grid = np.indices([dims[i] for i in others]).reshape(3, -1)
    rank = grid.shape[1]
    factors = [np.zeros((d, rank)) for d in dims]
    for mode, index in zip(others, grid):
        factors[mode][index, np.arange(rank)] = 1.0
    factors[free] = np.moveaxis(kernel, free, 0).reshape(dims[free], rank)
    return np.ones(rank), factors


def fit_cp(kernel: np.ndarray, rank: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """CP weights and factors of ``kernel`` at ``rank`` (TensorLy ``parafac``; exact at the full rank)."""
    if rank >= cp_full_rank(kernel.shape):
        return _exact_cp(kernel)
    from tensorly.decomposition import parafac

    with _numpy_backend(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        weights, factors = parafac(kernel, rank, init="svd", n_iter_max=200, tol=1e-9, random_state=0)
    return np.asarray(weights), [np.asarray(f) for f in factors]


def cp_factors(layer: Any, rank: int, fitted: tuple[np.ndarray, list[np.ndarray]] | None = None) -> list[Factor]:
    """1x1 Conv2D, kh x 1 and 1 x kw DepthwiseConv2D, 1x1 Conv2D (CP of rank ``rank``)."""

    kernel = kernel_of(layer)
    kh, kw, cin, cout = kernel.shape
    weights, (a, b, c, d) = fitted if fitted is not None else fit_cp(kernel, rank)
    (sh, sw), (dh, dw) = layer.strides, layer.dilation_rate
    inside, outside = _positions(_shape(layer, "input")), _positions(_shape(layer, "output"))
    in_w = _shape(layer, "input")[2] or 1
    out_h = _shape(layer, "output")[1] or 1
    one = {"kernel_size": (1, 1), "strides": (1, 1), "padding": "valid", "dilation_rate": (1, 1)}
    first = _factor(layer, f"{layer.name}_in", False, [c[None, None]], inside * cin * rank, filters=rank, **one)
    last = _factor(layer, f"{layer.name}_out", True, [(d * weights).T[None, None]], outside * rank * cout, **one)
    base = layer.get_config()
    dtype = _dtype(layer)
    keras = _keras(layer)
    depthwise = []
    for suffix, size, stride, dilation, kernel_1d, positions in [
        ("dh", (kh, 1), (sh, 1), (dh, 1), a[:, None, :, None], out_h * in_w * kh),
        ("dw", (1, kw), (1, sw), (1, dw), b[None, :, :, None], outside * kw),
    ]:
        layer_dw = keras.layers.DepthwiseConv2D(
            size, strides=stride, padding=base["padding"], dilation_rate=dilation, use_bias=False,
            depthwise_regularizer=base["kernel_regularizer"] and keras.regularizers.get(base["kernel_regularizer"]),
            dtype=base["dtype"], name=f"{layer.name}_{suffix}", trainable=base["trainable"])
        array = np.asarray(kernel_1d, dtype)
        depthwise.append(Factor(keras.layers.serialize(layer_dw), (array,), array.size, positions * rank))
    return [first, *depthwise, last]


def svd_kernel(factors: list[Factor]) -> np.ndarray:
    """The kernel two SVD factors compute (float64, as a matrix)."""
    first, second = (np.asarray(f.weights[0], np.float64) for f in factors)
    return first.reshape(-1, first.shape[-1]) @ second.reshape(second.shape[-2], -1)


def tucker2_kernel(factors: list[Factor]) -> np.ndarray:
    """The kernel the three Tucker-2 factors compute (float64)."""
    u_in, core, u_out = (np.asarray(f.weights[0], np.float64) for f in factors)
    return np.einsum("ca,hwab,bo->hwco", u_in[0, 0], core, u_out[0, 0])


def cp_kernel(factors: list[Factor]) -> np.ndarray:
    """The kernel the four CP factors compute (float64)."""
    c, a, b, d = (np.asarray(f.weights[0], np.float64) for f in factors)
    return np.einsum("cr,hr,wr,ro->hwco", c[0, 0], a[:, 0, :, 0], b[0, :, :, 0], d[0, 0])
