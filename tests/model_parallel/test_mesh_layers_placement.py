"""Every computation of a Keras model on a DTensor mesh runs with its shards, backward included: read
from the graphs TensorFlow's runtime partitioned per device and executed for the trainer's gradient
step (dumped with TF_DUMP_GRAPH_PREFIX, in a process of its own)."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

import pytest

_SCRIPT = r"""
import numpy as np
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import tensorflow as tf
from tensorfleet.model_parallel.mesh import Mesh

L = tf.keras.layers
mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
with mesh.scope():
    model = tf.keras.Sequential([tf.keras.Input((16,)), L.Dense(32, activation="relu", name="h"), L.Dense(8, name="o")])
    model.compile(tf.keras.optimizers.Adam(1e-2), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.RandomState(0).rand(32, 16).astype("float32")
model.fit(x, np.arange(32) % 8, batch_size=16, epochs=1, verbose=0)
"""

_MATMULS = {"MatMul", "_MklMatMul", "_FusedMatMul", "_MklNativeFusedMatMul", "_MklFusedMatMul"}


def _nodes(text: str) -> list[dict]:
    """name, op, device and the shapes of each node of a GraphDef pbtxt."""
    nodes = []
    for match in re.finditer(r'node \{\n  name: "([^"]*)"\n  op: "(\w+)"(.*?)\n\}', text, re.S):
        body = match.group(3)
        device = re.search(r'device: "[^"]*device:(\w+:\d+)"', body)

        def shape(key: str) -> list[int] | None:
            found = re.search(rf'key: "{key}"\n    value \{{\n      list \{{\n        shape \{{(.*?)\n        \}}',
                              body, re.S)
            return [int(s) for s in re.findall(r"size: (-?\d+)", found.group(1))] if found else None

        nodes.append({"name": match.group(1), "op": match.group(2), "device": device.group(1) if device else "",
                      "global": shape("_global_shape"), "local": shape("_output_shapes")})
    return nodes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_device_runs_its_own_forward_and_backward_matmuls_on_its_shards(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_DUMP_GRAPH_PREFIX": str(tmp_path),
           "TF_DUMP_GRAPH_NAME_FILTER": "gradients", "TF_DUMP_GRAPH_GROUPS": "main"}
    result = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=280, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # the graph of each device, as the runtime partitioned the gradient step's function and ran it
    executed = {}
    for path in sorted(tmp_path.glob("*gradients*_partition__*after_partition_passes.pbtxt")):
        nodes = _nodes(path.read_text())
        if any(n["op"] in _MATMULS for n in nodes):
            executed[re.search(r"device:(CPU:\d+)", path.name).group(1)] = nodes
    assert sorted(executed) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    for device, nodes in executed.items():
        assert {n["device"] for n in nodes} == {device}, device
        # the model's matmuls, not DTensor's own arithmetic on device ids
        model = [n["name"] for n in nodes
                 if n["op"] in _MATMULS and re.search(r"\bsequential(_\d+)?/", n["name"])
                 and "DTensor" not in n["name"]]
        backward = [name for name in model if "/gradients/" in name]
        # forward: h and o (each fused with its bias); backward: o's input and kernel, h's kernel
        assert (len(model) - len(backward), len(backward)) == (2, 3), (device, model)
        # a variable read's layer (h, o) in tf_keras' names (sequential/h/...) and Keras 3's (sequential_1/h_1/...)
        layer = re.compile(r"\bsequential(?:_\d+)?/(\w+?)(?:_\d+)?/")
        reads = {(layer.search(n["name"]).group(1), "kernel" if len(n["global"]) == 2 else "bias"):
                 (n["global"], n["local"]) for n in nodes if n["op"] == "ReadVariableOp"}
        # each device reads its half of every kernel's and bias' units (hidden:m), whole along the rest
        assert reads == {("h", "kernel"): ([16, 32], [16, 16]), ("h", "bias"): ([32], [16]),
                         ("o", "kernel"): ([32, 8], [32, 4]), ("o", "bias"): ([8], [4])}, device
        ops = collections.Counter(n["op"] for n in nodes)
        assert ops["CollectiveReduceV2"] >= 1, (device, ops)
