"""A user's own Mesh-TF model: plain ``import mesh_tensorflow`` works once tensorfleet's
model_parallel package is imported, without loading TensorFlow before it is needed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_USER_SCRIPT = r"""
import sys
import {first}
print("tensorflow loaded by the import:", "tensorflow" in sys.modules, flush=True)
import mesh_tensorflow as mtf  # plain import, as a Mesh-TF user writes it

from tensorfleet.strategies.devices import simulate_devices
simulate_devices(2)
from tensorfleet.model_parallel.mesh import Mesh
from tensorfleet.models.datasets import load_digits


def model_fn(_, mesh, inputs, dims):  # written with the user's own mtf module
    hidden = mtf.layers.dense(inputs, dims["hidden"], activation=mtf.relu, name="hidden")
    return mtf.layers.dense(hidden, dims["classes"], name="logits")


split = load_digits(flat=True)
history = Mesh("b1:2", "batch:b1").fit_mtf(model_fn, split.x_train[:128], split.y_train[:128],
                                           dims={{"hidden": 16, "classes": 10}}, epochs=2, verbose=False)
print("mtf", mtf.__name__, "steps", len(history.step_loss), "learned", history.loss[1] < history.loss[0],
      "kernel", history.weights["hidden/kernel"].shape, flush=True)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("first", ["tensorfleet.model_parallel.mesh", "tensorfleet.model_parallel"])
def test_user_imports_mesh_tensorflow_after_tensorfleet_and_trains_with_fit_mtf(first):
    result = subprocess.run([sys.executable, "-c", _USER_SCRIPT.format(first=first)], capture_output=True, text=True,
                            timeout=240, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["tensorflow loaded by the import: False",
                                          "mtf mesh_tensorflow steps 8 learned True kernel (64, 16)"]


def test_the_import_hook_is_installed_once_by_the_package():
    from tensorfleet.model_parallel import mtf_compat

    mtf_compat.fix_on_import()
    mtf_compat.fix_on_import()
    hooks = [finder for finder in sys.meta_path if type(finder).__name__ == "_FixBeforeImport"]
    assert len(hooks) == 1
    assert hooks[0].find_spec("numpy", None) is None  # it only ever lets the usual finders import
