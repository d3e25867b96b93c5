"""Compressed gradient all-reduce for ``mirrored`` and ``multi_worker_mirrored``: the ``compression`` option.

* ``"fp16"`` / ``"bf16"``: each float gradient cast to 16 bits, summed, cast back (Horovod's fp16 compression):
  half the bytes.
* ``"powersgd:rank=R"``: PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
  GradientCompression for Distributed Optimization", NeurIPS 2019), one step of subspace iteration per step,
  warm-started from the last step's Q, with error feedback, as PyTorch DDP's ``powerSGD_hook``. Each gradient of rank 2
  or more is seen as a matrix M (n rows, m columns: all axes but the last, the last) and, with E the error this
  replica kept from the last step and Q (m x r) the last step's Q orthogonalised::

      M <- G + E;  P <- sum over replicas of M Q;  P <- orthogonalise(P)  (Gram-Schmidt)
      Q <- sum over replicas of M^T P;  sum of G ~= P Q^T;  E <- M - P Q^T / replicas

  (in PyTorch's terms, the local error is M minus the mean approximation; Keras's gradients here are already
  divided by the replicas, so the sum is that mean). Only ``(n + m) r`` values per matrix go through the
  collective instead of ``n m``. A matrix for which that saves less than half (PyTorch's ``min_compression_rate``
  of 2) and the gradients of rank 0 and 1 (biases, norms) are summed uncompressed in the first collective, beside
  the Ps, as in the paper. Q and E are per-replica variables (``ON_READ``) of the strategy.
* ``"none"``: Keras's sum, through the same path, so its bytes are counted too.

Every tensor handed to the collective is counted (:func:`traffic`: bytes per step and per collective call, from
the tensors themselves); :func:`compressed_bytes` is the same arithmetic for the planner, from shapes alone.

Example:
    >>> spec = parse_compression("powersgd:rank=4")
    >>> spec.method.value, spec.rank
    ('powersgd', 4)
    >>> compressed_bytes(spec, [(3, 3, 16, 32), (32,)])  # a 144 x 32 kernel: (144 + 32) * 4 values, bias 32
    2944
    >>> parse_compression("powersgd:rank=0")
    Traceback (most recent call last):
    ...
    ValueError: compression's rank must be an integer >= 1. Received: compression='powersgd:rank=0'
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence

from tensorfleet.compat import allreduce

__all__ = ["STRATEGIES_TAKING", "AllReduceTraffic", "GradientCompression", "CompressionSpec", "attach",
           "compressed_bytes", "initial_q", "matrix_shape", "orthogonalize", "parse_compression", "traffic"]

STRATEGIES_TAKING = ("mirrored", "multi_worker_mirrored")
"""The strategies that take the ``compression`` option (their gradients are all-reduced by Keras)."""

MIN_COMPRESSION_RATE = 2.0
"""A matrix is compressed when ``n m >= 2 (n + m) r``, PyTorch's ``min_compression_rate`` default."""


class GradientCompression(str, Enum):
    """How the gradients go through the all-reduce."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"


@dataclass(frozen=True)
class CompressionSpec:
    """A compression method and its options (``rank`` applies to PowerSGD only)."""

    method: GradientCompression
    rank: int = 2

    def __str__(self) -> str:
        return f"powersgd:rank={self.rank}" if self.method is GradientCompression.POWERSGD else self.method.value


def parse_compression(value: str | CompressionSpec | None) -> CompressionSpec | None:
    """``"fp16"``, ``"bf16"``, ``"none"``, ``"powersgd"`` or ``"powersgd:rank=R"`` (default rank 2) as a spec."""
    if value is None or isinstance(value, CompressionSpec):
        return value
    words = ", ".join(repr(m.value) for m in GradientCompression)
    if not isinstance(value, str):
        raise ValueError(f"compression must be one of {words} (PowerSGD's rank as 'powersgd:rank=2'). "
                         f"Received: compression={value!r}")
    name, _, options = value.strip().lower().partition(":")
    try:
        method = GradientCompression(name.strip())
    except ValueError:
        raise ValueError(f"compression must be one of {words} (PowerSGD's rank as 'powersgd:rank=2'). "
                         f"Received: compression={value!r}") from None
    settings = dict(part.partition("=")[::2] for part in options.split(",") if part.strip()) if options else {}
    settings = {k.strip(): v.strip() for k, v in settings.items()}
    allowed = {"rank"} if method is GradientCompression.POWERSGD else set()
    unknown = sorted(set(settings) - allowed)
    if unknown:
        takes = "its options: rank" if allowed else "no options"
        raise ValueError(f"compression {method.value!r} takes {takes}, not {', '.join(unknown)}. "
                         f"Received: compression={value!r}")
    rank = settings.get("rank", "2")
    if not rank.isdigit() or int(rank) < 1:
        raise ValueError(f"compression's rank must be an integer >= 1. Received: compression={value!r}")
    return CompressionSpec(method, int(rank))


def matrix_shape(shape: Sequence[int], rank: int) -> tuple[int, int, int] | None:
    """``(n, m, r)`` when PowerSGD compresses a gradient of ``shape`` at ``rank``, else None (sent as it is)."""
    if len(shape) < 2:
        return None
    n, m = math.prod(shape[:-1]), shape[-1]
    r = min(n, m, rank)
    return (n, m, r) if n * m >= MIN_COMPRESSION_RATE * (n + m) * r else None


def compressed_bytes(spec: CompressionSpec | str | None, shapes: Sequence[Sequence[int]], value_bytes: int = 4) -> int:
    """Bytes one replica hands the collectives per step for gradients of ``shapes`` (``value_bytes`` each)."""
    spec = parse_compression(spec) or CompressionSpec(GradientCompression.NONE)
    if spec.method in (GradientCompression.FP16, GradientCompression.BF16):
        return sum(math.prod(s) for s in shapes) * min(2, value_bytes)
    if spec.method is GradientCompression.NONE:
        return sum(math.prod(s) for s in shapes) * value_bytes
    values = 0
    for shape in shapes:
        nmr = matrix_shape(shape, spec.rank)
        values += math.prod(shape) if nmr is None else (nmr[0] + nmr[1]) * nmr[2]
    return values * value_bytes


def orthogonalize(matrix: Any, epsilon: float = 1e-8) -> Any:
    """The columns of ``matrix`` (n x r) made orthonormal, left to right (Gram-Schmidt, as PyTorch's hook)."""
    import tensorflow as tf

    columns: list[Any] = []
    for i in range(matrix.shape[1]):
        column = matrix[:, i]
        for previous in columns:
            column = column - tf.reduce_sum(previous * column) * previous
        columns.append(column / (tf.norm(column) + epsilon))
    return tf.stack(columns, axis=1)


def initial_q(columns: int, rank: int, index: int, dtype: Any = "float32") -> Any:
    """The first Q of the ``index``-th compressed gradient: normal values, the same on every replica and worker
    (the paper's shared random start), orthogonalised at its first use as every Q is."""
    import tensorflow as tf

    return tf.random.stateless_normal((columns, rank), seed=(index, 41), dtype=dtype)


# --------------------------------------------------------------------------- what goes through the collective


@dataclass
class AllReduceTraffic:
    """What one replica handed the collectives in one training step, counted from the tensors themselves."""

    method: str
    calls: list[int] = field(default_factory=list)
    """Bytes of each collective call of one step, in order."""
    gradient_bytes: int = 0
    """Bytes of the gradients (what Keras's own sum would have handed the collective)."""

    @property
    def bytes_per_step(self) -> int:
        return sum(self.calls)

    @property
    def ratio(self) -> float:
        """How many times fewer bytes than the gradients themselves."""
        return self.gradient_bytes / self.bytes_per_step if self.bytes_per_step else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "calls": list(self.calls), "bytes_per_step": self.bytes_per_step,
                "gradient_bytes": self.gradient_bytes, "ratio": self.ratio}


def _nbytes(tensor: Any) -> int:
    count = tensor.shape.num_elements()
    if count is None:
        raise ValueError(f"A gradient of unknown shape {tensor.shape} cannot be counted or compressed; "
                         "compression needs the static shapes dense variables have.")
    return int(count) * tensor.dtype.size


class _Reducer:
    """Sums the gradients over the replicas; a subclass compresses them on the way. Counts what it sends."""

    counts_one_replica = True

    def __init__(self, spec: CompressionSpec) -> None:
        self.spec = spec
        self.traffic = AllReduceTraffic(str(spec))
        self._step = threading.local()  # MirroredStrategy traces its replicas in threads, interleaved

    def _all_reduce(self, context: Any, tensors: list[Any]) -> list[Any]:
        import tensorflow as tf

        if not tensors:
            return []
        self._step.calls.append(sum(_nbytes(t) for t in tensors))
        return context.all_reduce(tf.distribute.ReduceOp.SUM, tensors)

    def __call__(self, context: Any, grads: Sequence[Any], keys: Sequence[Any]) -> list[Any]:
        self._step.calls = []
        reduced = self.reduce(context, list(grads), list(keys))
        # Traced once per replica (and again on a retrace): each time the same tensors, so the last one stands.
        self.traffic.calls = list(self._step.calls)
        self.traffic.gradient_bytes = sum(_nbytes(g) for g in grads)
        return reduced

    def reduce(self, context: Any, grads: list[Any], keys: list[Any]) -> list[Any]:
        return self._all_reduce(context, grads)


class _CastReducer(_Reducer):
    def reduce(self, context: Any, grads: list[Any], keys: list[Any]) -> list[Any]:
        import tensorflow as tf

        wire = tf.float16 if self.spec.method is GradientCompression.FP16 else tf.bfloat16
        cast = [tf.cast(g, wire) if g.dtype.is_floating and g.dtype.size > wire.size else g for g in grads]
        return [tf.cast(s, g.dtype) for s, g in zip(self._all_reduce(context, cast), grads)]


class _PowerSGDReducer(_Reducer):
    def __init__(self, spec: CompressionSpec) -> None:
        super().__init__(spec)
        self.state: dict[Any, tuple[Any, Any]] = {}  # key -> (Q, E), per-replica variables

    def _create_state(self, strategy: Any, missing: list[tuple[Any, Any]]) -> None:
        import tensorflow as tf

        with tf.init_scope(), strategy.scope():
            for key, grad in missing:
                shape = matrix_shape(grad.shape.as_list(), self.spec.rank)
                assert shape is not None  # missing holds only the gradients PowerSGD compresses
                n, m, r = shape
                q = tf.Variable(initial_q(m, r, len(self.state), grad.dtype), trainable=False, name="powersgd_q",
                                synchronization=tf.VariableSynchronization.ON_READ,
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                error = tf.Variable(tf.zeros((n, m), grad.dtype), trainable=False, name="powersgd_error",
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.MEAN)
                self.state[key] = (q, error)

    def reduce(self, context: Any, grads: list[Any], keys: list[Any]) -> list[Any]:
        import tensorflow as tf

        shapes = [matrix_shape(g.shape.as_list(), self.spec.rank) for g in grads]
        missing = [(k, g) for k, g, s in zip(keys, grads, shapes) if s is not None and k not in self.state]
        if missing:
            context.merge_call(lambda strategy: self._create_state(strategy, missing))
        plain = [g for g, s in zip(grads, shapes) if s is None]
        packed = [(g, k, s) for g, k, s in zip(grads, keys, shapes) if s is not None]
        matrices = [tf.reshape(g, s[:2]) + self.state[k][1] for g, k, s in packed]
        ps = [tf.matmul(mat, orthogonalize(self.state[k][0])) for mat, (_, k, _) in zip(matrices, packed)]
        first = self._all_reduce(context, plain + ps)
        summed_plain, summed_ps = first[:len(plain)], [orthogonalize(p) for p in first[len(plain):]]
        qs = self._all_reduce(context, [tf.matmul(mat, p, transpose_a=True) for mat, p in zip(matrices, summed_ps)])
        replicas = tf.cast(context.num_replicas_in_sync, grads[0].dtype) if grads else None
        approx = {}
        for mat, p, q, (g, k, _) in zip(matrices, summed_ps, qs, packed):
            total = tf.matmul(p, q, transpose_b=True)
            state_q, error = self.state[k]
            error.assign(mat - total / replicas)
            state_q.assign(q)
            approx[k] = tf.reshape(total, g.shape)
        plain_iter = iter(summed_plain)
        return [next(plain_iter) if s is None else approx[k] for k, s in zip(keys, shapes)]


_REDUCERS = {GradientCompression.NONE: _Reducer, GradientCompression.FP16: _CastReducer,
             GradientCompression.BF16: _CastReducer, GradientCompression.POWERSGD: _PowerSGDReducer}
_attached: weakref.WeakKeyDictionary[Any, _Reducer] = weakref.WeakKeyDictionary()


def _lookup(strategy: Any) -> _Reducer | None:
    return None if strategy is None else _attached.get(strategy)


def attach(strategy: Any, compression: str | CompressionSpec | None) -> CompressionSpec | None:
    """Makes the gradient all-reduce of Keras models trained under ``strategy`` use ``compression``.

    What :func:`tensorfleet.strategies.build` does with the ``compression`` option of ``mirrored`` and
    ``multi_worker_mirrored``. None leaves the strategy as TensorFlow made it.

    Raises:
        ValueError: a ``compression`` that is not a method (the message lists them), or a strategy that does not
            all-reduce gradients (the message names the strategies that do).
    """
    import tensorflow as tf

    spec = parse_compression(compression)
    if spec is None:
        return None
    if not isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        raise ValueError(f"compression applies to strategies that all-reduce the gradients: "
                         f"{', '.join(STRATEGIES_TAKING)}. Received: compression={str(spec)!r} for a "
                         f"{type(strategy).__name__}.")
    _attached[strategy] = _REDUCERS[spec.method](spec)
    allreduce.install(_lookup)
    return spec


def traffic(strategy_or_model: Any) -> AllReduceTraffic:
    """What each step handed the collectives under a strategy built with ``compression`` (or a model's strategy).

    Filled in when the first training step is traced; before that its ``calls`` are empty.

    Raises:
        ValueError: the strategy was built without ``compression`` (``compression="none"`` counts Keras's sum).
    """
    strategy = getattr(strategy_or_model, "distribute_strategy", strategy_or_model)
    reducer = _lookup(strategy)
    if reducer is None:
        raise ValueError("This strategy was built without the compression option, so nothing counts its "
                         "all-reduce; build it with compression='none' to count Keras's own sum. Received: "
                         f"{type(strategy).__name__}")
    return reducer.traffic
