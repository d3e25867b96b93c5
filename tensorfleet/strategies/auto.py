"""``auto``: choose the strategy the environment calls for, and say why.

The order, first match wins: TF_CONFIG with ``ps`` tasks -> parameter_server; TF_CONFIG with
several workers -> multi_worker_mirrored; a TPU (attached, or named by ``TPU_NAME``) -> tpu;
more than one local device -> mirrored; else one_device.

The choice is printed (one line on stderr, ``tensorfleet: strategy 'auto' chose 'mirrored'
(2 local CPU devices)``): a user who asked tensorfleet to choose wants to see what it chose,
without configuring logging first. ``announce=False`` keeps it quiet; the choice is also
logged at INFO.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping

from tensorfleet.strategies.devices import local_devices, local_tpu_devices
from tensorfleet.strategies.registry import build, register
from tensorfleet.strategies.tf_config import tf_config_from_env

__all__ = ["choose", "auto"]

log = logging.getLogger(__name__)


def choose(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The strategy name ``auto`` would build here, and the reason.

    Example:
        >>> choose({"TF_CONFIG": ""})[0] in ("one_device", "mirrored")
        True
    """
    env = os.environ if environ is None else environ
    config = tf_config_from_env(env)
    if config is not None and config.has_ps:
        return "parameter_server", f"TF_CONFIG has {config.cluster.num_tasks('ps')} ps task(s)"
    if config is not None and config.num_workers > 1:
        return "multi_worker_mirrored", f"TF_CONFIG has {config.num_workers} workers"
    tpus = local_tpu_devices()
    if tpus or env.get("TPU_NAME"):
        return "tpu", (f"{len(tpus)} TPU core(s) attached" if tpus else f"TPU_NAME={env['TPU_NAME']}")
    devices = local_devices()
    kind = devices[0].device_type
    if len(devices) > 1:
        return "mirrored", f"{len(devices)} local {kind} devices"
    return "one_device", f"one local {kind} device"


def auto(*, announce: bool = True, **options: Any) -> Any:
    """Builds the strategy :func:`choose` picks, passing ``options`` through.

    With ``announce`` (the default) the choice and its reason are printed on stderr.
    """
    name, reason = choose()
    log.info("tensorfleet auto strategy: chose %r because %s", name, reason)
    if announce:
        print(f"tensorfleet: strategy 'auto' chose {name!r} ({reason})", file=sys.stderr, flush=True)
    return build(name, **options)


register("auto", auto, description="Chooses from TF_CONFIG, TPUs and local devices; prints its choice.")
