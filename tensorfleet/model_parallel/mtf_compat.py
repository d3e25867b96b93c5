"""The one place that imports mesh-tensorflow.

mesh-tensorflow 0.1.21 calls ``tensorflow.python.framework.ops.register_tensor_conversion_function``
at import time; TensorFlow 2.13 moved that function to ``tensor_conversion_registry`` and
removed the alias, so ``import mesh_tensorflow`` fails with an ``AttributeError`` on the
TensorFlow 2.14 stack. :func:`import_mesh_tensorflow` restores the alias (only if it is
missing) and then imports the package. Every tensorfleet module that needs Mesh-TF goes
through it, never through a bare ``import mesh_tensorflow``; what tensorfleet reads from inside
mesh-tensorflow's objects is read here too (:func:`layout_pairs`).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["apply_compat_fix", "import_mesh_tensorflow", "layout_pairs", "needs_compat_fix"]


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


def import_mesh_tensorflow() -> ModuleType:
    """Applies the compatibility fix, then imports and returns ``mesh_tensorflow``.

    Example:
        >>> mtf = import_mesh_tensorflow()
        >>> str(mtf.convert_to_shape("b1:2;b2:2"))
        'Shape[b1=2, b2=2]'
    """
    apply_compat_fix()
    try:
        return importlib.import_module("mesh_tensorflow")
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
