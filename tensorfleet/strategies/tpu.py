"""``tpu``: TensorFlow's ``TPUStrategy`` on an attached TPU or one reached by name or address.

Registered as ``"tpu"``. Without a TPU it fails at once with :class:`NoTPUError`, before it
touches the network: an address is probed with one TCP connection, a TPU name is only resolved
where it can be (a Cloud VM, or with ``zone`` and ``project``).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from tensorfleet.strategies.devices import local_tpu_devices
from tensorfleet.strategies.registry import Availability, register

__all__ = ["NoTPUError", "tpu"]


class NoTPUError(RuntimeError):
    """No TPU can be reached from this machine."""


def _parse_tpu_address(tpu_address: str) -> tuple[str, int] | None:
    """(host, port) for a grpc://host:port address; None for a TPU name."""
    if tpu_address.startswith("grpc://"):
        rest = tpu_address[len("grpc://"):]
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"tpu_address must look like 'grpc://host:8470'. Received: tpu_address={tpu_address!r}")
        return host, int(port)
    if "://" in tpu_address or not tpu_address.replace("-", "").replace("_", "").isalnum():
        raise ValueError(
            "tpu_address must be a TPU name (letters, digits, '-', '_') or 'grpc://host:port'. "
            f"Received: tpu_address={tpu_address!r}"
        )
    return None


def tpu(*, tpu_address: str | None = None, zone: str | None = None, project: str | None = None,
        connect_timeout: float = 5.0) -> Any:
    """``TPUStrategy`` over the TPU at ``tpu_address`` (a name or ``grpc://host:port``).

    Without an address, uses a TPU attached to this machine or named by ``TPU_NAME``. When
    none is there, raises :class:`NoTPUError` without touching the network.

    Example (this machine has no TPU):
        >>> tpu()
        Traceback (most recent call last):
        ...
        tensorfleet.strategies.tpu.NoTPUError: No TPU is attached to this machine and no tpu_address (or TPU_NAME) was
        given. ...
    """
    import tensorflow as tf

    if tpu_address is None:
        tpu_address = os.environ.get("TPU_NAME")
    if tpu_address is not None:
        if not isinstance(tpu_address, str) or not tpu_address:
            raise ValueError(f"tpu_address must be a non-empty string. Received: tpu_address={tpu_address!r}")
        endpoint = _parse_tpu_address(tpu_address)
        if endpoint is not None:
            try:
                socket.create_connection(endpoint, timeout=connect_timeout).close()
            except OSError as exc:
                raise NoTPUError(f"No TPU worker answers at {tpu_address} ({exc.strerror or exc}). "
                                 "Check the address, or build 'mirrored' or 'one_device' instead.") from None
        elif zone is None and project is None and not _on_cloud_vm():
            raise NoTPUError(
                f"The TPU name {tpu_address!r} can only be resolved on a Cloud VM (or with zone= and "
                "project=). This machine is neither; pass tpu_address='grpc://host:port' instead."
            )
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address, zone=zone, project=project)
        tf.config.experimental_connect_to_cluster(resolver)
    else:
        if not local_tpu_devices():
            raise NoTPUError(
                "No TPU is attached to this machine and no tpu_address (or TPU_NAME) was given. "
                "Received: tpu_address=None. Pass tpu_address='grpc://host:8470' or a TPU name, or "
                "build 'mirrored' or 'one_device' instead."
            )
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _on_cloud_vm() -> bool:
    return os.path.exists("/sys/class/dmi/id/product_name") and "Google" in open(
        "/sys/class/dmi/id/product_name", encoding="utf-8", errors="ignore").read()


def _check_tpu() -> Availability:
    if local_tpu_devices():
        return Availability(True, "a TPU is attached")
    if os.environ.get("TPU_NAME"):
        return Availability(True, f"TPU_NAME={os.environ['TPU_NAME']}")
    return Availability(False, "no TPU attached and no TPU_NAME")


register("tpu", tpu, check=_check_tpu, description="TPUStrategy on an attached or addressed TPU.")
