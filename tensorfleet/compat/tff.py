"""tensorflow-federated: whether it can be imported here, and one clear error where it cannot.

TFF's last releases (0.87-0.89) pin TensorFlow 2.14 and Python < 3.12, so it lives on the tff track
only (``make install-tff``). Only the ``tff`` federated backend, the remote TFF workers and the
adapter that accepts a TFF ClientData import it.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

__all__ = ["TFF_TRACK_HINT", "TffUnavailableError", "import_tff", "tff_available"]

TFF_TRACK_HINT = ("tensorflow-federated pins TensorFlow 2.14 and Python 3.11: use the tff track "
                  "(`make install-tff`, then `.venv-tff/bin/python`), or the compiled backend (backend='compiled'), "
                  "which needs no TFF")


class TffUnavailableError(ImportError):
    """tensorflow-federated is needed for what was asked but cannot be imported in this environment."""


@functools.lru_cache(maxsize=None)
def tff_available() -> bool:
    """True when ``import tensorflow_federated`` would work (found and importable with this TensorFlow)."""
    if importlib.util.find_spec("tensorflow_federated") is None:
        return False
    try:
        import tensorflow_federated  # noqa: F401
    except Exception:  # any import failure (TFF 0.87 on TensorFlow 2.21 fails deep in its imports)
        return False
    return True


def import_tff(what: str) -> Any:
    """``tensorflow_federated``, or :class:`TffUnavailableError` saying that ``what`` needs it and how to get it."""
    try:
        import tensorflow_federated as tff
    except Exception as error:
        raise TffUnavailableError(f"{what} needs tensorflow-federated, which cannot be imported here "
                                  f"({type(error).__name__}: {error}). {TFF_TRACK_HINT}.") from error
    return tff
