"""Runs an unmodified training script with its first ``fit`` profiled: what a launcher runs per task.

``python -m tensorfleet.profiling.autorun train.py [ARGS...]`` runs ``train.py`` as ``python train.py``
would, except that when ``TENSORFLEET_PROFILE_STEPS`` is set, the script's first call of Keras'
``Model.fit`` gets a :class:`~tensorfleet.profiling.callback.ProfileCallback` for those steps
(directory ``TENSORFLEET_PROFILE_DIR``, one folder per task from TF_CONFIG) unless it already
has one. Only the first ``fit`` is recorded: later ones (an evaluation loop's, a second phase's)
would write more captures into the same task folder. Without the variable the script runs untouched.

The script's Keras is whichever it uses: the ``fit`` of tf_keras' ``Model`` and of Keras 3's (when the
``keras`` package here is Keras 3) are both wrapped until the first of them runs; then both are restored.
"""

from __future__ import annotations

import contextlib
import functools
import os
import runpy
import sys
from typing import Any, Mapping, Sequence

from tensorfleet.compat.keras import keras2, keras3
from tensorfleet.profiling.recorder import callbacks

__all__ = ["install", "main"]


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Makes the next ``Model.fit`` of Keras 3 or tf_keras record the environment's steps; False when none
    are set."""
    extra = callbacks(environ)
    if not extra:
        return False

    from tensorfleet.profiling.callback import ProfileCallback

    patched: list[tuple[Any, Any]] = []  # (Model class, of either Keras; its own fit or None when inherited)

    def restore() -> None:
        for model_class, own in patched:
            if own is None:
                del model_class.fit
            else:
                model_class.fit = own
        patched.clear()

    def wrap(model_class: Any) -> None:
        original = model_class.fit

        @functools.wraps(original)
        def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
            restore()  # the first fit only, of either Keras
            given = list(kwargs.get("callbacks") or [])
            if not any(isinstance(c, ProfileCallback) for c in given):
                kwargs["callbacks"] = given + extra
            return original(self, *args, **kwargs)

        patched.append((model_class, model_class.__dict__.get("fit")))
        model_class.fit = fit

    for model_class in _model_classes():
        wrap(model_class)
    return True


def _model_classes() -> list[type]:
    """The ``Model`` classes a script here can fit: tf_keras' (or TensorFlow 2.14's ``tf.keras``), and Keras 3's."""
    classes = []
    with contextlib.suppress(ImportError):
        classes.append(keras2().Model)
    with contextlib.suppress(ImportError):  # the tff track's keras is Keras 2.14: tf.keras itself
        model_class = keras3().Model
        if all(model_class is not c for c in classes):
            classes.append(model_class)
    return classes


def main(argv: Sequence[str] | None = None) -> None:
    """Runs ``argv[0]`` as ``__main__`` with ``argv`` as its ``sys.argv``, profiled as the environment says."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m tensorfleet.profiling.autorun SCRIPT [ARGS...]")
    install()
    sys.argv = args
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))  # as "python SCRIPT" has it
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
