"""Runs an unmodified training script with its first ``fit`` profiled: what a launcher runs per task.

``python -m tensorfleet.profiling.autorun train.py [ARGS...]`` runs ``train.py`` as ``python train.py``
would, except that when ``TENSORFLEET_PROFILE_STEPS`` is set, the script's first call of Keras'
``Model.fit`` gets a :class:`~tensorfleet.profiling.callback.ProfileCallback` for those steps
(directory ``TENSORFLEET_PROFILE_DIR``, one folder per task from TF_CONFIG) unless it already
has one. Only the first ``fit`` is recorded: later ones (an evaluation loop's, a second phase's)
would write more captures into the same task folder. Without the variable the script runs untouched.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from typing import Any, Mapping, Sequence

from tensorfleet.profiling.recorder import callbacks
from tensorfleet.compat.keras import keras2

__all__ = ["install", "main"]


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Makes the next ``tf.keras.Model.fit`` record the environment's steps; False when none are set."""
    extra = callbacks(environ)
    if not extra:
        return False

    from tensorfleet.profiling.callback import ProfileCallback

    model_class = keras2().Model
    original = model_class.fit

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        model_class.fit = original  # the first fit only
        given = list(kwargs.get("callbacks") or [])
        if not any(isinstance(c, ProfileCallback) for c in given):
            kwargs["callbacks"] = given + extra
        return original(self, *args, **kwargs)

    model_class.fit = fit
    return True


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
