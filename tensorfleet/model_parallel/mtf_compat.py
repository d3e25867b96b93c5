"""The one place that imports mesh-tensorflow.

mesh-tensorflow 0.1.21 calls ``tensorflow.python.framework.ops.register_tensor_conversion_function``
at import time; TensorFlow 2.13 moved that function to ``tensor_conversion_registry`` and
removed the alias, so ``import mesh_tensorflow`` fails with an ``AttributeError`` on the
TensorFlow 2.14 stack. :func:`import_mesh_tensorflow` restores the alias (only if it is
missing) and then imports the package. Every tensorfleet module that needs Mesh-TF goes
through it, never through a bare ``import mesh_tensorflow``; what tensorfleet reads from inside
mesh-tensorflow's objects is read here too (:func:`layout_pairs`).

Users who write their own Mesh-TF models (for :meth:`Mesh.fit_mtf
<tensorfleet.model_parallel.mesh.Mesh.fit_mtf>`) call ``tfl.model_parallel.import_mesh_tensorflow()``,
or simply ``import mesh_tensorflow`` after importing ``tensorfleet.model_parallel`` (or anything
in it): the package installs :func:`fix_on_import`, an import hook that applies the fix just
before mesh-tensorflow is first imported. The hook loads nothing itself, so importing
tensorfleet still loads no TensorFlow.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from types import ModuleType
from typing import Any

__all__ = ["apply_compat_fix", "fix_on_import", "import_mesh_tensorflow", "layout_pairs", "needs_compat_fix"]

_PACKAGE = "mesh_tensorflow"


def needs_compat_fix() -> bool:
    """True when this TensorFlow lacks ``ops.register_tensor_conversion_function``."""
    from tensorflow.python.framework import ops

    return not hasattr(ops, "register_tensor_conversion_function")


def apply_compat_fix() -> bool:
    """Restores ``ops.register_tensor_conversion_function`` if it is missing.

    Returns:
        True if the alias was added by this call, False if it was already there.
    """
    from tensorflow.python.framework import ops, tensor_conversion_registry

    if hasattr(ops, "register_tensor_conversion_function"):
        return False
    ops.register_tensor_conversion_function = tensor_conversion_registry.register_tensor_conversion_function
    return True


class _FixBeforeImport(importlib.abc.MetaPathFinder):
    """Applies the compatibility fix when ``mesh_tensorflow`` is about to be imported; finds nothing."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == _PACKAGE and _PACKAGE not in sys.modules:
            apply_compat_fix()
        return None  # the usual finders import the package


def fix_on_import() -> None:
    """Makes a plain ``import mesh_tensorflow`` work on this TensorFlow, from now on in this process.

    Installs (once) an import hook that applies :func:`apply_compat_fix` just before
    mesh-tensorflow is imported; ``import tensorfleet.model_parallel`` calls it. Until then
    nothing is imported, so it costs nothing to a program that never uses Mesh-TF.
    """
    if not any(isinstance(finder, _FixBeforeImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FixBeforeImport())


def import_mesh_tensorflow() -> ModuleType:
    """Applies the compatibility fix, then imports and returns ``mesh_tensorflow``.

    Example:
        >>> mtf = import_mesh_tensorflow()
        >>> str(mtf.convert_to_shape("b1:2;b2:2"))
        'Shape[b1=2, b2=2]'
    """
    apply_compat_fix()
    try:
        return importlib.import_module(_PACKAGE)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Mesh-TensorFlow layouts need the mesh-tensorflow package. Install it with "
            "`pip install 'tensorfleet[mesh]'` (mesh-tensorflow==0.1.21)."
        ) from exc


def layout_pairs(rules: Any) -> list[tuple[str, str]]:
    """The sorted ``(tensor_dim, mesh_dim)`` pairs of an ``mtf.LayoutRules``.

    Example:
        >>> layout_pairs(import_mesh_tensorflow().convert_to_layout_rules("hidden:b2;batch:b1"))
        [('batch', 'b1'), ('hidden', 'b2')]
    """
    # mtf.LayoutRules keeps its pairs in a set with no public accessor.
    return sorted(rules._pairs)
