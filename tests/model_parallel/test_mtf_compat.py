"""mesh-tensorflow through tensorfleet.compat.mesh_tf: a user's plain ``import mesh_tensorflow`` works once
tensorfleet's model_parallel package is imported, without loading TensorFlow before it is needed, and the
Estimator stand-in that today's TensorFlow needs for the import is seen by mesh-tensorflow alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import user_env  # a user's process: nothing has imported tf_keras (or tf.compat.v1) yet

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
@pytest.mark.slow
def test_user_imports_mesh_tensorflow_after_tensorfleet_and_trains_with_fit_mtf(first):
    result = subprocess.run([sys.executable, "-c", _USER_SCRIPT.format(first=first)], capture_output=True, text=True,
                            timeout=240, env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["tensorflow loaded by the import: False",
                                          "mtf mesh_tensorflow steps 8 learned True kernel (64, 16)"]


def test_the_import_hook_is_installed_once_by_the_package():
    from tensorfleet.compat import mesh_tf

    mesh_tf.fix_on_import()
    mesh_tf.fix_on_import()
    hooks = [finder for finder in sys.meta_path if type(finder).__name__ == "_FixBeforeImport"]
    assert len(hooks) == 1
    assert hooks[0].find_spec("numpy", None) is None  # any other module: left to the usual finders


_ESTIMATOR_SCRIPT = r"""
import sys
import tensorflow as tf
from tensorfleet.compat.mesh_tf import estimator_stub, import_mesh_tensorflow, tensorflow_has_estimator

had = tensorflow_has_estimator()
attribute = hasattr(tf.compat.v1, "estimator")
mtf = import_mesh_tensorflow()
base = mtf.ops.MtfRestoreHook.__mro__[1]
print("estimator before", had, "after", tensorflow_has_estimator(), "attribute unchanged",
      hasattr(tf.compat.v1, "estimator") == attribute)
print("left in sys.modules", sorted(k for k in sys.modules if k.startswith(tf.compat.v1.__name__ + ".estimator")))
if not had:
    print("hook base is the stand-in:", base.__module__ == tf.compat.v1.__name__ + ".estimator", base.__name__)
    try:
        mtf.ops.MtfRestoreHook(None)
    except RuntimeError as error:
        print("using it:", str(error).split(";")[0])
    with estimator_stub():
        from tensorflow.compat.v1 import estimator
        print("inside the stub", estimator.ModeKeys.TRAIN, estimator.ModeKeys.PREDICT)
    print("after the stub", tensorflow_has_estimator())
"""


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_estimator_stand_in_exists_only_while_mesh_tensorflow_imports():
    result = subprocess.run([sys.executable, "-c", _ESTIMATOR_SCRIPT], capture_output=True, text=True, timeout=240,
                            env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    import tensorflow as tf

    if tf.__version__.split(".")[:2] in (["2", "14"], ["2", "15"]):  # the tff track: TensorFlow's own Estimator
        assert lines == ["estimator before True after True attribute unchanged True", "left in sys.modules []"]
    else:
        assert lines == ["estimator before False after False attribute unchanged True", "left in sys.modules []",
                         "hook base is the stand-in: True SessionRunHook",
                         "using it: MtfRestoreHook is an Estimator hook of mesh-tensorflow",
                         "inside the stub train infer", "after the stub False"]
