"""Model-parallel serving: a model cut into stages, served stage to stage with micro-batches in flight.

At export (``export(model, base, stages=K)``) the model's chain of layers is cut with the pipeline
module's :func:`~tensorfleet.model_parallel.pipeline.partition_layers`, and each stage is saved as
its own signature, ``stage_0`` ... ``stage_{K-1}``, beside ``serving_default`` (the whole model).
At serving time (``ModelServer(stages=K)``), :class:`StagedRunner` keeps one thread per stage,
each optionally on its own device (``stage_devices=``, ``tensorfleet serve --stage-devices``); a batch is cut into
micro-batches that flow through the stages, so stage ``s`` works on micro-batch ``i`` while stage ``s + 1`` works on ``i
- 1`` (the forward half of GPipe's schedule). The rows come back in order and equal the unsplit model's.

A Keras 3 model is cut the same way: its chain is read through Keras 3's public graph (each layer's
``input`` is the ``output`` of the one before), as :func:`~tensorfleet.model_parallel.chain.chain_layers`
reads a tf_keras model's.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from tensorfleet.compat.keras import Keras, keras_of, module_of
from tensorfleet.serving.servable import Servable
from tensorfleet.validation import positive_int

__all__ = ["STAGE_TENSOR", "StagedRunner", "stage_devices", "stage_functions", "stage_names"]

STAGE_TENSOR = "activations"  # the name of every tensor passed between stages


def stage_names(num_stages: int) -> list[str]:
    """The stage signatures' names.

    Example:
        >>> stage_names(3)
        ['stage_0', 'stage_1', 'stage_2']
    """
    return [f"stage_{i}" for i in range(positive_int("stages", num_stages))]


def stage_devices(devices: Sequence[str], num_stages: int) -> list[str]:
    """The device each stage runs on, one per stage, checked against this process's logical devices.

    Devices are TensorFlow's names (``/cpu:1``, ``/device:GPU:0``). CPU devices beyond the first
    are logical devices split from the one physical CPU: they are made here when TensorFlow's
    runtime has not started yet (as ``tensorfleet serve --stage-devices`` does), else they must
    exist already (:func:`tensorfleet.strategies.simulate_devices`, first thing in the program).

    Example:
        >>> stage_devices(["/cpu:0", "/cpu:1"], 2)  # doctest: +SKIP
        ['/device:CPU:0', '/device:CPU:1']
    """
    import tensorflow as tf

    from tensorfleet.strategies.devices import RuntimeAlreadyInitializedError, simulate_devices

    devices = list(devices)
    if len(devices) != positive_int("stages", num_stages):
        raise ValueError(f"Give one device per stage: {num_stages} stage(s), {len(devices)} device(s). "
                         f"Received: stage_devices={devices}")
    specs = []
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device.strip())
        except ValueError:
            spec = None
        if spec is None or not spec.device_type:
            raise ValueError(f"A stage device is a TensorFlow device name such as '/cpu:1' or '/gpu:0'. "
                             f"Received: {device!r}")
        specs.append(spec)
    cpus = [s.device_index or 0 for s in specs if s.device_type.upper() == "CPU"]
    if cpus and max(cpus) > 0:
        try:
            simulate_devices(max(cpus) + 1)
        except RuntimeAlreadyInitializedError:
            pass  # the check below names what exists and how to get more
    known = {(d.device_type, int(d.name.rsplit(":", 1)[1])): d.name for d in tf.config.list_logical_devices()}
    names = []
    for device, spec in zip(devices, specs):
        name = known.get((spec.device_type.upper(), spec.device_index or 0))
        if name is None:
            raise ValueError(f"Unknown stage device {device!r}; this process has {sorted(known.values())} "
                             "(more logical CPUs: tensorfleet.strategies.simulate_devices(n) before any other "
                             "TensorFlow call).")
        names.append(name)
    return names


def stage_functions(model: Any, num_stages: int, input_name: str, output_name: str, *,
                    boundaries: Sequence[int] | None = None) -> list[Any]:
    """One ``tf.function`` per stage: stage 0 takes ``input_name``, the last returns ``output_name``,
    the others pass :data:`STAGE_TENSOR`."""
    import tensorflow as tf

    from tensorfleet.model_parallel.pipeline.stages import partition_layers

    layers = _chain(model)
    weights = [sum(math.prod(v.shape) for v in layer.trainable_variables) for layer in layers]
    parts = partition_layers(layers, num_stages, boundaries=boundaries, weights=weights)
    spec = tf.TensorSpec([None, *model.inputs[0].shape[1:]], model.inputs[0].dtype, name=input_name)
    functions = []
    for index, layers in enumerate(parts):
        out_name = output_name if index == len(parts) - 1 else STAGE_TENSOR
        function = tf.function(_stage(layers, out_name), input_signature=[spec])
        functions.append(function)
        out = function.get_concrete_function().structured_outputs[out_name]
        spec = tf.TensorSpec([None, *out.shape[1:]], out.dtype, name=STAGE_TENSOR)
    return functions


def _chain(model: Any) -> list[Any]:
    """The model's layers as one chain, each feeding the next (a clear ValueError naming the layer if not)."""
    from tensorfleet.model_parallel.chain import chain_layers

    if keras_of(model, "tfl.serving.export") is Keras.KERAS2:
        return chain_layers(model)
    keras = module_of(model)
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if not layers:
        raise ValueError(f"Model {model.name!r} has no layers to split into stages.")
    if isinstance(model, keras.Sequential):
        # A Sequential is a chain by construction. Its graph cannot be walked through layer.input/output: one
        # loaded from a .keras file is built twice, and its first layer's `output` is the first build's, not the
        # tensor the next layer reads.
        repeated = next((layer for i, layer in enumerate(layers) if layer in layers[:i]), None)
        if repeated is not None:
            _not_a_chain(model, repeated, "is used more than once")
        return layers
    expected, previous = model.inputs[0], None
    for layer in layers:
        if layer.input is not expected:
            source = "the model's input" if previous is None else f"the output of {previous.name!r}"
            _not_a_chain(model, layer, f"does not take {source} as its only input (a branch, a merge, or a "
                                       "layer called more than once)")
        expected, previous = layer.output, layer
    if expected is not model.outputs[0]:
        _not_a_chain(model, layers[-1], "makes an output that is not the model's (a layer is called more than once, "
                                        "or the output comes from a branch)")
    return layers


def _not_a_chain(model: Any, layer: Any, why: str) -> None:
    raise ValueError(f"Serving a model in stages needs a model whose layers form one chain (each layer feeding the "
                     f"next); layer {layer.name!r} of model {model.name!r} does not. Wrap branching parts in one "
                     f"layer. Received: layer {layer.name!r} of type {type(layer).__name__}, which {why}")


def _stage(layers: list, out_name: str) -> Any:
    def stage(x: Any) -> dict[str, Any]:
        for layer in layers:
            x = layer(x, training=False)
        return {out_name: x}

    return stage


class _Job:
    def __init__(self, count: int) -> None:
        self.results: list[np.ndarray | None] = [None] * count
        self.left = count
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()

    def finish(self, index: int, value: np.ndarray | None, error: BaseException | None = None) -> None:
        with self.lock:
            self.results[index] = value
            self.error = self.error or error
            self.left -= 1
            if self.left == 0:
                self.done.set()


class StagedRunner:
    """Runs ``serving_default`` requests through a servable's stage signatures, one thread per stage.

    Example:
        >>> runner = StagedRunner(servable, num_stages=2, micro_batches=4)  # doctest: +SKIP
        >>> runner.run("serving_default", {"image": x})                     # doctest: +SKIP
        >>> runner.close()                                                  # doctest: +SKIP
    """

    def __init__(self, servable: Servable, num_stages: int, *, micro_batches: int = 4,
                 devices: Sequence[str] | None = None) -> None:
        self.servable = servable
        self.names = stage_names(num_stages)
        missing = [n for n in self.names if n not in servable.signatures]
        if missing:
            raise ValueError(f"Serving {num_stages} stages needs signatures {self.names}; version "
                             f"{servable.version} ({servable.path}) has {sorted(servable.signatures)} "
                             f"(export it with stages={num_stages}, or `tensorfleet serving export MODEL BASE "
                             f"--stages {num_stages}`).")
        self.micro_batches = positive_int("micro_batches", micro_batches)
        self.devices = stage_devices(devices, num_stages) if devices else []
        self.placed: list[str | None] = [None] * num_stages  # where each stage's last output was made
        first, last = servable.signatures[self.names[0]], servable.signatures[self.names[-1]]
        self.input_name, self.output_name = next(iter(first.inputs)), next(iter(last.outputs))
        self._queues: list[queue.Queue] = [queue.Queue() for _ in self.names]
        self._threads = [threading.Thread(target=self._stage, args=(i,), name=f"tfl-stage-{i}", daemon=True)
                         for i in range(len(self.names))]
        for thread in self._threads:
            thread.start()

    def _stage(self, index: int) -> None:
        import tensorflow as tf

        name = self.names[index]
        in_name = next(iter(self.servable.signatures[name].inputs))
        out_name = next(iter(self.servable.signatures[name].outputs))
        device = self.devices[index] if self.devices else None
        while True:
            item = self._queues[index].get()
            if item is None:
                return
            job, chunk, value = item
            if job.error is not None:
                job.finish(chunk, None)
                continue
            try:
                with tf.device(device) if device else contextlib.nullcontext():
                    tensor = self.servable.call(name, {in_name: value})[out_name]
                self.placed[index] = tensor.device
                value = tensor.numpy()
            except Exception as exc:  # the request fails, the stage goes on
                job.finish(chunk, None, exc)
                continue
            if index + 1 < len(self.names):
                self._queues[index + 1].put((job, chunk, value))
            else:
                job.finish(chunk, value)

    def run(self, signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The request's outputs; ``serving_default`` goes stage to stage, other signatures run whole."""
        if (signature or "serving_default") != "serving_default":
            return self.servable.run(signature, arrays)
        rows = arrays[self.input_name]
        chunks = [c for c in np.array_split(rows, min(self.micro_batches, max(1, len(rows) // 2))) if len(c)]
        job = _Job(len(chunks))
        for index, chunk in enumerate(chunks):
            self._queues[0].put((job, index, chunk))
        job.done.wait()
        if job.error is not None:
            raise job.error
        results = [r for r in job.results if r is not None]
        assert len(results) == len(job.results)  # every chunk finished without an error: each has its value
        return {self.output_name: np.concatenate(results)}

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(30)

