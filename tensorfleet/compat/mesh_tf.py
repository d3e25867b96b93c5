"""mesh-tensorflow on today's TensorFlow: the one place that imports it and reads its internals.

mesh-tensorflow 0.1.21 (its last release, 2022) does not import as shipped on the TensorFlow tensorfleet runs:

* TensorFlow 2.13 removed ``tensorflow.python.framework.ops.register_tensor_conversion_function`` (it lives in
  ``tensor_conversion_registry`` now), which mesh-tensorflow calls at import time: the alias is restored
  (:func:`apply_import_fixes`; on both tracks).
* TensorFlow 2.16 dropped Estimator, and ``mesh_tensorflow.ops`` still runs
  ``from tensorflow.compat.v1 import estimator`` to subclass ``SessionRunHook`` and
  ``CheckpointSaverListener`` (for its Estimator hooks, which tensorfleet never uses). While a module of
  mesh-tensorflow executes, a stub (:func:`estimator_stub`) answers that import, and is taken away again when it
  has run: ``tf.compat.v1`` itself is never changed, and ``from tensorflow.compat.v1 import estimator`` still
  fails everywhere else. Where TensorFlow still has Estimator (the tff track's 2.14), the real one is used.
* It needs ``gin-config`` (a declared dependency of its own that some installs miss).

:func:`fix_on_import` installs an import hook that applies these just before mesh-tensorflow's modules run, so a
user's plain ``import mesh_tensorflow`` works after ``import tensorfleet.model_parallel``; the hook loads
nothing itself (importing tensorfleet still loads no TensorFlow). :func:`import_mesh_tensorflow` is the way in
for tensorfleet's own code.

Example:
    >>> mtf = import_mesh_tensorflow()
    >>> str(mtf.convert_to_shape("b1:2;b2:2"))
    'Shape[b1=2, b2=2]'
    >>> layout_pairs(mtf.convert_to_layout_rules("hidden:b2;batch:b1"))
    [('batch', 'b1'), ('hidden', 'b2')]
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Any, Iterator

__all__ = [
    "apply_import_fixes", "estimator_stub", "fix_on_import", "import_mesh_tensorflow", "layout_pairs",
    "needs_conversion_alias", "tensorflow_has_estimator",
]

_PACKAGE = "mesh_tensorflow"
_INSTALL_HINT = "Install it with `pip install 'tensorfleet[mesh]'` (mesh-tensorflow==0.1.21 and gin-config)."


def needs_conversion_alias() -> bool:
    """True when this TensorFlow lacks ``ops.register_tensor_conversion_function`` (TF >= 2.13), which
    mesh-tensorflow calls at import time."""
    from tensorflow.python.framework import ops

    return not hasattr(ops, "register_tensor_conversion_function")


def tensorflow_has_estimator() -> bool:
    """Whether ``from tensorflow.compat.v1 import estimator`` works here (TF < 2.16 with tensorflow-estimator)."""
    try:
        from tensorflow.compat.v1 import estimator  # noqa: F401
    except ImportError:
        return False
    return True


def apply_import_fixes() -> bool:
    """Restores ``ops.register_tensor_conversion_function`` (moved to ``tensor_conversion_registry`` in
    TensorFlow 2.13) if it is missing; mesh-tensorflow registers its tensor conversion through it.

    Returns:
        True if the alias was added by this call, False if it was already there.
    """
    from tensorflow.python.framework import ops, tensor_conversion_registry

    if hasattr(ops, "register_tensor_conversion_function"):
        return False
    ops.register_tensor_conversion_function = tensor_conversion_registry.register_tensor_conversion_function
    return True


class _EstimatorGone:
    """Base of mesh-tensorflow's Estimator hooks where TensorFlow has no Estimator: defining a subclass works,
    using one says why it cannot."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{cls.__name__} is an Estimator hook of mesh-tensorflow; this TensorFlow has no "
                           "Estimator (removed in TensorFlow 2.16). tensorfleet trains Mesh-TF graphs in a "
                           "tf.compat.v1 Session instead (Mesh.fit_mtf).")


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "Stand-in for tf.compat.v1.estimator while mesh-tensorflow imports "
                                    "(tensorfleet.compat.mesh_tf); TensorFlow >= 2.16 has no Estimator.")

    def __getattr__(attribute: str) -> Any:
        raise AttributeError(f"tf.compat.v1.estimator.{attribute} does not exist on this TensorFlow (Estimator was "
                             "removed in TensorFlow 2.16); mesh-tensorflow's Estimator-based parts cannot run here.")

    vars(module).update({
        "SessionRunHook": type("SessionRunHook", (_EstimatorGone,), {"__module__": name}),
        "CheckpointSaverListener": type("CheckpointSaverListener", (_EstimatorGone,), {"__module__": name}),
        # Read by mesh_tensorflow.transformer to tell training from inference: the values tf.estimator had.
        "ModeKeys": type("ModeKeys", (), {"TRAIN": "train", "EVAL": "eval", "PREDICT": "infer"}),
        "__getattr__": __getattr__,
    })
    return module


_STUB_LOCK = threading.RLock()
_STUB_DEPTH = [0]


@contextlib.contextmanager
def estimator_stub() -> Iterator[None]:
    """Inside, ``from tensorflow.compat.v1 import estimator`` finds a stub where TensorFlow has no Estimator.

    The stub is put in ``sys.modules`` under the name that import falls back to (``<tf.compat.v1's
    __name__>.estimator``) and removed on exit; ``tf.compat.v1`` gets no attribute, so TensorFlow and every
    other library see no change. Nested uses share one stub. Where Estimator exists, this does nothing.
    """
    # The module `from tensorflow.compat.v1 import ...` resolves, by its import name: `tf.compat.v1` is another
    # object (tensorflow._api.v2.compat.v1) until something, such as tf_keras, imports tensorflow.compat.v1.
    key = f"{importlib.import_module('tensorflow.compat.v1').__name__}.estimator"
    with _STUB_LOCK:
        if _STUB_DEPTH[0]:
            _STUB_DEPTH[0] += 1
        elif key not in sys.modules and not tensorflow_has_estimator():
            sys.modules[key] = _stub_module(key)
            _STUB_DEPTH[0] = 1
        else:  # TensorFlow's own Estimator (or someone's module of that name): nothing to do
            key = ""
    try:
        yield
    finally:
        if key:
            with _STUB_LOCK:
                _STUB_DEPTH[0] -= 1
                if _STUB_DEPTH[0] == 0:
                    sys.modules.pop(key, None)


class _FixingLoader(importlib.abc.Loader):
    """Runs a mesh-tensorflow module with the import fixes applied and the Estimator stub in place."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        apply_import_fixes()
        with estimator_stub():
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, get_source, ...: the wrapped loader's
        return getattr(self.loader, name)


class _FixBeforeImport(importlib.abc.MetaPathFinder):
    """Finds ``mesh_tensorflow`` and its submodules with the usual finders and has them run by
    :class:`_FixingLoader`; every other name it leaves to the usual finders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _PACKAGE and not fullname.startswith(_PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or isinstance(spec.loader, _FixingLoader):
            return spec
        spec.loader = _FixingLoader(spec.loader)
        return spec


def fix_on_import() -> None:
    """Makes a plain ``import mesh_tensorflow`` work on this TensorFlow, from now on in this process.

    Installs (once) an import hook that runs mesh-tensorflow's modules with :func:`apply_import_fixes` applied
    and :func:`estimator_stub` in place. ``import tensorfleet.model_parallel`` calls it. It imports nothing
    itself, so it costs nothing to a program that never uses Mesh-TF.
    """
    if not any(isinstance(finder, _FixBeforeImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FixBeforeImport())


def import_mesh_tensorflow() -> types.ModuleType:
    """``mesh_tensorflow``, imported with the fixes this TensorFlow needs.

    Raises:
        ImportError: mesh-tensorflow (or its gin-config) is not installed (the message says what to install),
            or it failed to import for another reason (the message names it).

    Example:
        >>> import_mesh_tensorflow().__name__
        'mesh_tensorflow'
    """
    fix_on_import()
    if _PACKAGE not in sys.modules:
        apply_import_fixes()  # also when an earlier import of the package failed half-way
    try:
        return importlib.import_module(_PACKAGE)
    except ModuleNotFoundError as exc:
        if exc.name in (_PACKAGE, "gin"):
            raise ImportError("Mesh-TensorFlow layouts need the "
                              f"{'gin-config' if exc.name == 'gin' else 'mesh-tensorflow'} package, which is not "
                              f"installed. {_INSTALL_HINT}") from exc
        raise ImportError(f"mesh-tensorflow did not import on TensorFlow here: {exc}") from exc
    except ImportError as exc:
        raise ImportError(f"mesh-tensorflow did not import on TensorFlow here: {exc}") from exc


def layout_pairs(rules: Any) -> list[tuple[str, str]]:
    """The sorted ``(tensor_dim, mesh_dim)`` pairs of an ``mtf.LayoutRules``: it keeps them in a private set
    ``_pairs`` and has no public accessor (only ``tensor_dimension_to_mesh_axis``, which needs the mesh shape).

    Example:
        >>> layout_pairs(import_mesh_tensorflow().convert_to_layout_rules(""))
        []
    """
    return sorted(rules._pairs)
