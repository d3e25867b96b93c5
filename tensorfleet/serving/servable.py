"""One loaded model version and its signatures: what a request is checked against and run on.

A request's tensors are checked here, once, for every front (REST, gRPC, the batcher): the
input names, each tensor's dtype and shape against the signature, and one batch size shared
by all inputs. A failed check is a :class:`~tensorfleet.serving.errors.ServingError` that names
the input, what was received and what the signature expects.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tensorfleet.serving.errors import Code, ServingError

__all__ = ["SavedModelError", "Servable", "Signature", "TensorSpecInfo", "to_array"]


class SavedModelError(ValueError):
    """A version folder that TensorFlow cannot load as a SavedModel (damaged, truncated or another kind of file
    in ``saved_model.pb`` or ``variables/``), or one without signatures; the message names the folder."""


@dataclass(frozen=True)
class TensorSpecInfo:
    """A signature tensor's numpy dtype and shape (``None`` for a dimension of any size)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"


def _received(array: np.ndarray) -> str:
    return f"{array.dtype.name}{list(array.shape)}"


def to_array(name: str, value: Any, spec: TensorSpecInfo) -> np.ndarray:
    """A JSON value (nested lists of numbers) as an array of ``spec``'s dtype, or a ServingError.

    Integers are accepted for float inputs (as JSON writes ``1.0`` as ``1``); fractions for
    integer inputs, strings for numeric inputs and ragged lists are refused.
    """
    try:
        array = np.asarray(value)
    except ValueError:
        raise ServingError(f"Input {name!r} is a ragged list; every row must have the shape "
                           f"{spec.describe()} expects.") from None
    kind, want = array.dtype.kind, spec.dtype
    if kind in "OUSV" and want.kind not in "OUS":
        raise ServingError(f"Input {name!r} must hold {want.name} numbers. Received: {str(value)[:80]}")
    if kind == "f" and want.kind in "iu" and not np.all(np.mod(array, 1) == 0):
        raise ServingError(f"Input {name!r} must hold integers ({want.name}). Received fractions: "
                           f"{str(value)[:80]}")
    return array.astype(want, copy=False)


class Signature:
    """A named signature of a loaded SavedModel: its input and output specs and the function."""

    def __init__(self, name: str, function: Any) -> None:
        self.name = name
        self.function = function
        _, kwargs = function.structured_input_signature
        self.inputs = {k: TensorSpecInfo(k, np.dtype(s.dtype.as_numpy_dtype), tuple(s.shape.as_list()))
                       for k, s in sorted(kwargs.items())}
        self.outputs = {k: TensorSpecInfo(k, np.dtype(t.dtype.as_numpy_dtype), tuple(t.shape.as_list()))
                        for k, t in sorted(function.structured_outputs.items())}
        self._inner = {k: s.shape[1:] if s.shape and s.shape[0] is None and None not in s.shape[1:] else None
                       for k, s in self.inputs.items()}
        # one input whose every size past the batch is known: the REST front reads its rows straight
        # into an array of that shape (tensorfleet.serving.rest.read_instances)
        only = next(iter(self.inputs.values())) if len(self.inputs) == 1 else None
        self.row_input: str | None = None
        self.row_shape: tuple[int, ...] | None = None
        if only is not None and len(only.shape) >= 1:
            inner = [d for d in only.shape[1:] if d is not None and d > 0]
            if len(inner) == len(only.shape) - 1:
                self.row_input, self.row_shape = only.name, tuple(inner)

    def check(self, inputs: Mapping[str, np.ndarray], *, strict_dtype: bool = False) -> dict[str, np.ndarray]:
        """``inputs`` with every name, dtype and shape checked; the arrays returned share one batch size.

        ``strict_dtype`` (gRPC, whose tensors carry a dtype) refuses a dtype other than the
        signature's; otherwise numbers are converted as :func:`to_array` does.
        """
        if not isinstance(inputs, dict) or inputs.keys() != self.inputs.keys():
            missing, unknown = sorted(set(self.inputs) - set(inputs)), sorted(set(inputs) - set(self.inputs))
            if missing or unknown:
                raise ServingError(f"Signature {self.name!r} takes inputs {sorted(self.inputs)}; missing {missing}, "
                                   f"unknown {unknown}.")
        arrays = {}
        for name, spec in self.inputs.items():
            value = inputs[name]
            if strict_dtype:
                array = np.asarray(value)
                if array.dtype != spec.dtype:
                    raise ServingError(f"Input {name!r} must be {spec.dtype.name}. Received: {array.dtype.name}")
            else:
                array = to_array(name, value, spec)
            inner = self._inner[name]  # every size past the batch known: one comparison
            if array.ndim != len(spec.shape) or (array.shape[1:] != inner if inner is not None else
                                                  any(d is not None and d != a
                                                      for d, a in zip(spec.shape, array.shape))):
                raise ServingError(f"Input {name!r} must have shape {spec.describe()}. Received: {_received(array)}")
            arrays[name] = array
        sizes = {a.shape[0] for a in arrays.values()}
        if len(sizes) != 1:
            raise ServingError(f"All inputs must have the same batch size. Received: "
                               f"{ {k: a.shape[0] for k, a in arrays.items()} }")
        if sizes == {0}:
            raise ServingError("The request has no rows (batch size 0); send at least one instance.")
        return arrays

    def filter_outputs(self, names: list[str] | None) -> list[str]:
        """The outputs to return: all of them, or ``names`` if each is one of them."""
        if not names:
            return list(self.outputs)
        unknown = sorted(set(names) - set(self.outputs))
        if unknown:
            raise ServingError(f"Unknown output(s) {unknown} in output_filter; signature {self.name!r} has "
                               f"{sorted(self.outputs)}.")
        return list(names)


class Servable:
    """One version of a model, loaded with ``tf.saved_model.load``, and a count of its signature calls.

    Example:
        >>> servable = Servable("digits", 1, "models/digits/1")        # doctest: +SKIP
        >>> servable.run("serving_default", {"image": x})["logits"]     # doctest: +SKIP
    """

    def __init__(self, name: str, version: int, path: str | Path) -> None:
        import tensorflow as tf

        self.name, self.version, self.path = name, int(version), Path(path)
        try:
            loaded = tf.saved_model.load(str(self.path))
        except Exception as error:  # noqa: BLE001 - whatever TensorFlow cannot read in the folder is the folder's fault
            first = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
            raise SavedModelError(f"Version {self.version} of {name!r} at {self.path} is not a SavedModel TensorFlow "
                                  f"can load ({type(error).__name__}: {first}); expected the folder "
                                  "tensorfleet serving export (or tf.saved_model.save) writes.") from None
        self._loaded = loaded  # keeps the variables the signatures capture alive
        self.signatures = {k: Signature(k, fn) for k, fn in loaded.signatures.items()}
        if not self.signatures:
            raise SavedModelError(f"The SavedModel at {self.path} has no signatures; export it with "
                                  "tensorfleet.serving.export.")
        self._lock = threading.Lock()
        self.calls = 0
        self.batch_sizes: Counter[int] = Counter()
        self.warmup_records = 0  # warm-up records replayed on this version (tensorfleet.serving.warmup)

    def signature(self, name: str | None) -> Signature:
        """The signature called ``name`` ('' or None: ``serving_default``); NOT_FOUND-style error if absent."""
        key = name or "serving_default"
        if key not in self.signatures:
            raise ServingError(f"Serving signature name: {key!r} not found in signature def; this model has "
                               f"{sorted(self.signatures)}.", Code.FAILED_PRECONDITION)
        return self.signatures[key]

    def call(self, signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Calls the signature once on checked ``arrays``; returns every output as a tensor (where it
        was placed: ``tensor.device``)."""
        import tensorflow as tf

        sig = self.signature(signature)
        rows = next(iter(arrays.values())).shape[0]
        with self._lock:
            self.calls += 1
            self.batch_sizes[rows] += 1
        return sig.function(**{k: tf.constant(v) for k, v in arrays.items()})

    def run(self, signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Calls the signature once on checked ``arrays``; returns every output as numpy."""
        return {k: v.numpy() for k, v in self.call(signature, arrays).items()}

    def signature_defs(self) -> dict[str, Any]:
        """The SavedModel's SignatureDef protos by name, as TF Serving's metadata API returns them."""
        from tensorflow.core.protobuf import saved_model_pb2

        saved = saved_model_pb2.SavedModel()
        saved.ParseFromString((self.path / "saved_model.pb").read_bytes())
        defs = saved.meta_graphs[0].signature_def
        return {k: defs[k] for k in sorted(defs) if not k.startswith("__")}
