"""The compat seam holds: outside ``tensorfleet/compat/`` nothing reaches into another library's private parts.

Read from the syntax tree of every module: imports of private modules (``tensorflow.python``,
``keras.src``, ``tf_keras.src``, ``keras_tuner.src``, ``tensorflow_federated.python``, the profiler's
converters) and ``obj._name`` attributes or ``getattr(obj, "_name")`` strings whose name tensorfleet
does not define itself.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensorfleet"
COMPAT = PACKAGE / "compat"
PRIVATE_MODULES = ("tensorflow.python", "keras.src", "tf_keras.src", "keras_tuner.src", "tensorflow_federated.python",
                   "tensorboard_plugin_profile", "xprof", "tflite_runtime", "ai_edge_litert", "mesh_tensorflow")
# Single-underscore names that are public API: os._exit, sys._getframe, namedtuple's methods.
PUBLIC_UNDERSCORED = {"_exit", "_getframe", "_asdict", "_replace", "_fields", "_make", "_field_defaults"}
REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def _trees() -> dict[Path, ast.AST]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _own_names(trees: dict[Path, ast.AST]) -> set[str]:
    """Names tensorfleet defines: functions, classes, variables, arguments, attributes set on self/cls."""
    own: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                own.add(node.attr)
    return own


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORED


def _reaches(path: Path, tree: ast.AST, own: set[str]) -> list[str]:
    where = path.relative_to(PACKAGE.parent)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else []
        else:
            modules = []
        found += [f"{where}:{node.lineno}: import {m}" for m in modules if m.startswith(PRIVATE_MODULES)]
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            found.append(f"{where}:{node.lineno}: .{node.attr}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _private(node.args[1].value)
                and node.args[1].value not in own):
            found.append(f"{where}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_private_reach_outside_compat() -> None:
    trees = _trees()
    own = _own_names(trees)
    found = [reach for path, tree in trees.items() if COMPAT not in path.parents
             for reach in _reaches(path, tree, own)]
    assert not found, "private parts of other libraries reached outside tensorfleet/compat/:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("import tensorflow.python.ops.gen_nn_ops", ["import tensorflow.python.ops.gen_nn_ops"]),
    ("from keras.src.engine import base_layer_utils", ["import keras.src.engine"]),
    ("oracle._retry_queue = []", ["._retry_queue"]),
    ("x = layer._query_dense.kernel", ["._query_dense"]),
    ("getattr(attention, '_use_bias')", ["getattr(..., '_use_bias')", ]),
    ("os._exit(3); self._mine = 1; y = self._mine", []),
])
def test_the_check_catches_private_reaches(source: str, expected: list[str]) -> None:
    tree = ast.parse(source)
    own = _own_names({PACKAGE / "probe.py": tree})
    assert [r.split(": ", 1)[1] for r in _reaches(PACKAGE / "probe.py", tree, own)] == expected


def _run(code: str, **env: str) -> str:
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    environ.update(env, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


SCRIPT = """
import os, sys
import tensorflow as tf
before = (os.environ.get("TF_USE_LEGACY_KERAS"), sorted(f.__class__.__name__ for f in sys.meta_path))
import tensorfleet, tensorfleet.strategies, tensorfleet.tuning, tensorfleet.compat.keras
import keras_tuner
from tensorfleet.compat.keras import keras_flavour
after = (os.environ.get("TF_USE_LEGACY_KERAS"), sorted(f.__class__.__name__ for f in sys.meta_path))
import subprocess
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('TF_USE_LEGACY_KERAS'))"],
                       capture_output=True, text=True).stdout.strip()
from keras_tuner.src.backend import config
print(before == after, after[0], child, keras_flavour(), tf.keras.Model.__module__.split(".")[0],
      "multi" if config.multi_backend() else "keras2")
"""


def _tf_major_minor() -> tuple[int, int]:
    from importlib.metadata import version

    return tuple(int(part) for part in version("tensorflow").split(".")[:2])  # type: ignore[return-value]


@pytest.mark.slow
def test_import_tensorfleet_changes_neither_tf_keras_nor_keras_tuner_nor_children() -> None:
    # A user's process as it starts: no TF_USE_LEGACY_KERAS. Importing tensorfleet (and its rooms) sets none,
    # for the process or a child it starts, adds no import hook, and leaves tf.keras and Keras Tuner on the
    # Keras they choose themselves: Keras 3 on TensorFlow >= 2.16, Keras 2 on 2.14.
    if _tf_major_minor() >= (2, 16):
        assert _run(SCRIPT) == "True None None keras3 keras multi"
    else:
        assert _run(SCRIPT) == "True None None keras2 keras keras2"


@pytest.mark.slow
def test_tensorfleets_import_of_tfmot_leaves_the_users_keras_choice() -> None:
    # tfmot 0.8 sets TF_USE_LEGACY_KERAS=1 as it is imported; the capability probe (and tfl.edge's optimizers)
    # import it through tensorfleet.compat.tfmot, which puts the user's environment back.
    if importlib.util.find_spec("tensorflow_model_optimization") is None:  # found, not imported: its import would
        pytest.skip("tensorflow-model-optimization is not installed")   # set the variable in the suite's process
    code = ("import os, sys\nfrom tensorfleet.capabilities import probe_all\nprobe_all()\n"
            "print(os.environ.get('TF_USE_LEGACY_KERAS'), 'tensorflow_model_optimization' in sys.modules)")
    assert _run(code) == "None True"


@pytest.mark.slow
def test_a_users_own_legacy_keras_choice_is_kept() -> None:
    if _tf_major_minor() < (2, 16):
        pytest.skip("TensorFlow 2.14 reads no TF_USE_LEGACY_KERAS: its tf.keras is Keras 2 already")
    # A user who wants Keras 2 sets the variable before TensorFlow starts; tensorfleet keeps it.
    assert _run(SCRIPT, TF_USE_LEGACY_KERAS="1").split()[:5] == ["True", "1", "1", "tf_keras", "tf_keras"]


def test_a_keras3_model_gets_one_error_naming_the_way_to_keras2() -> None:
    from tensorfleet.compat.keras import Keras3ModelError, keras_major, require_keras2

    if keras_major("keras") < 3:
        pytest.skip("Keras 3 is not installed on this track (TensorFlow 2.14's keras is 2.14)")
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(Keras3ModelError, match=r"^tfl\.edge\.convert runs Keras 2 \(tf_keras\) models only for now, "
                                               r"and received a Keras 3 model \(keras\.src\.models\.sequential\."
                                               r"Sequential\)\. For Keras 2, build the model with `import tf_keras as "
                                               r"keras`"):
        require_keras2(model, "tfl.edge.convert")


def test_keras_of_tells_each_keras_and_names_what_is_none() -> None:
    from tensorfleet.compat.keras import Keras, keras2, keras_of, module_of

    model = keras2().Sequential([keras2().layers.Dense(2, input_shape=(3,))])
    assert keras_of(model) is Keras.KERAS2 and module_of(model) is keras2()
    assert keras_of(keras2().optimizers.SGD()) is Keras.KERAS2
    with pytest.raises(TypeError, match=r"^probe takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type int$"):
        keras_of(3, "probe")


def test_keras_names_are_one_vocabulary() -> None:
    from tensorfleet.compat.keras import Keras, as_keras

    assert [as_keras(name) for name in ("keras2", "tf_keras", "2", "keras3", "Keras", "3")] == \
        [Keras.KERAS2] * 3 + [Keras.KERAS3] * 3
    with pytest.raises(ValueError, match=r"^keras must be one of 'keras3', 'keras2' \(also 'tf_keras'\), or None "
                                         r"for the Keras tf.keras is in this process\. Received: keras='jax'$"):
        as_keras("jax")


def test_no_module_of_the_package_reads_tf_keras() -> None:
    # What `tf.keras` is depends on the user's process; the package names the Keras it means (keras2(), the
    # model's own Keras, or the user's through compat.keras.keras_module), so only the seam reads tf.keras.
    import io
    import tokenize

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "compat" / "keras.py":
            continue
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
                  if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
        for i in range(len(tokens) - 2):
            if [t.string for t in tokens[i:i + 3]] == ["tf", ".", "keras"]:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{tokens[i].start[0]}")
    assert found == []


def test_what_is_no_keras_model_is_named() -> None:
    from tensorfleet.compat.keras import require_keras2

    with pytest.raises(TypeError,
                       match=r"^probe takes a Keras model \(Keras 3 or tf_keras\)\. Received: model of type int$"):
        require_keras2(3, "probe")


def test_tff_missing_is_one_error_naming_the_tff_track(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tensorfleet.compat.tff import TffUnavailableError, import_tff

    monkeypatch.setitem(sys.modules, "tensorflow_federated", None)  # what an environment without TFF gives
    with pytest.raises(TffUnavailableError, match=r"the tff backend needs tensorflow-federated.*make install-tff"):
        import_tff("the tff backend")


@pytest.mark.slow
def test_import_tensorfleet_imports_no_library() -> None:
    assert _run("import sys, tensorfleet; print(sorted(m for m in ('tensorflow', 'keras', 'keras_tuner', "
                "'tf_keras') if m in sys.modules))") == "[]"


def test_saved_files_are_read_by_the_keras_that_wrote_them(tmp_path: Path, keras3) -> None:
    import numpy as np

    from tensorfleet.compat.keras import Keras, keras2, keras_of, load_model, saved_keras

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    written = {}
    for name, module in (("k3", keras3), ("k2", keras2())):
        model = module.Sequential([module.Input((3,)), module.layers.Dense(2, name="out")])
        model.save(tmp_path / f"{name}.keras")
        written[name] = model.predict(x, verbose=0)
    model2 = keras2().Sequential([keras2().Input((3,)), keras2().layers.Dense(2)])
    model2.save(tmp_path / "k2.h5")
    assert [saved_keras(tmp_path / f) for f in ("k3.keras", "k2.keras", "k2.h5")] == \
        [Keras.KERAS3, Keras.KERAS2, Keras.KERAS2]
    for name, kind in (("k3", Keras.KERAS3), ("k2", Keras.KERAS2)):
        loaded = load_model(tmp_path / f"{name}.keras", compile=False)
        assert keras_of(loaded) is kind
        np.testing.assert_allclose(loaded.predict(x, verbose=0), written[name], rtol=1e-6)


def test_damaged_or_foreign_model_files_get_one_error_naming_the_file(tmp_path: Path) -> None:
    import zipfile

    from tensorfleet.compat.keras import KerasFileError, load_model, saved_keras

    (tmp_path / "random.keras").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(KerasFileError, match=r"random\.keras is neither a \.keras archive \(zip\) nor an \.h5 model"):
        saved_keras(tmp_path / "random.keras")
    with zipfile.ZipFile(tmp_path / "nometa.keras", "w") as archive:
        archive.writestr("config.json", "{}")
    with pytest.raises(KerasFileError, match=r"nometa\.keras is a zip archive but not a readable \.keras model: its "
                                             r"metadata\.json is missing or damaged"):
        load_model(tmp_path / "nometa.keras")
    with pytest.raises(KerasFileError, match=r"^No Keras model file at .*missing\.keras \(nothing there\); expected a "
                                             r"\.keras or \.h5 file$"):
        saved_keras(tmp_path / "missing.keras")
    with pytest.raises(KerasFileError, match=r"\(a folder\)"):
        saved_keras(tmp_path)
    with zipfile.ZipFile(tmp_path / "broken.keras", "w") as archive:
        archive.writestr("metadata.json", '{"keras_version": "3.15.1"}')
        archive.writestr("config.json", "not json")
    with pytest.raises(KerasFileError,
                       match=r"^probe: .*broken\.keras \(saved by keras3\) could not be loaded by keras "):
        load_model(tmp_path / "broken.keras", where="probe")
