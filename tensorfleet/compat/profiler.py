"""The profiler as tensorfleet uses it: its XSpace converter and protos, wherever the installed release
keeps them, and the private hooks the profiling room needs from Keras' ``fit`` and tf.distribute.

The converter from a recorded XSpace to the trace viewer's Chrome trace JSON was
``tensorboard_plugin_profile.convert.raw_to_tool_data`` (tensorboard-plugin-profile 2.14, the tff
track, where the tool is asked for as ``trace_viewer^``); it is now ``xprof.convert.raw_to_tool_data``
(xprof 2.22 on the current track, tool ``trace_viewer``: the trailing ``^`` is an old format it maps
and warns about). tensorboard-plugin-profile 2.24 itself needs absl-py 2, which tfmot 0.8.1 does not
allow, so xprof is the converter on today's stack.

Example:
    >>> from tensorfleet.compat.profiler import converter_name
    >>> converter_name() in ("xprof", "tensorboard_plugin_profile", None)
    True
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, ContextManager

from tensorfleet.compat.keras import keras2

__all__ = ["ConverterMissingError", "callback_list_calling", "cluster_coordinator", "cluster_resolver",
           "converter_name", "implements_train_batch_hooks", "set_train_batch_hooks", "step_trace",
           "trace_viewer_json", "uses_coordinator", "xplane_pb2"]

# (module that holds raw_to_tool_data, how it names the trace viewer tool), newest first.
_CONVERTERS = (("xprof", "trace_viewer"), ("tensorboard_plugin_profile", "trace_viewer^"))


class ConverterMissingError(ImportError):
    """Neither xprof nor tensorboard-plugin-profile is installed: no XSpace can become a trace."""


def converter_name() -> str | None:
    """The installed package that converts XSpaces (``xprof`` or ``tensorboard_plugin_profile``), or None."""
    for package, _ in _CONVERTERS:
        if importlib.util.find_spec(package) is not None:
            return package
    return None


def trace_viewer_json(xspace_path: str) -> str | None:
    """The trace viewer's JSON (Chrome trace events) for one ``.xplane.pb`` file, converted by the
    profiler's own tool; None (or empty) when the converter could not read the file.

    Raises:
        ConverterMissingError: neither xprof nor tensorboard-plugin-profile is installed.
    """
    package = converter_name()
    if package is None:
        raise ConverterMissingError(
            "Converting a profile to a trace needs xprof (the profiler's converter on TensorFlow >= 2.16: "
            "pip install xprof) or, on the tff track, tensorboard-plugin-profile.")
    tool = dict(_CONVERTERS)[package]
    if package == "xprof":
        from xprof.convert import raw_to_tool_data
    else:
        from tensorboard_plugin_profile.convert import raw_to_tool_data
    data, _ = raw_to_tool_data.xspace_to_tool_data([xspace_path], tool, {})
    if isinstance(data, bytes):
        data = data.decode()
    return data


def xplane_pb2() -> Any:
    """The XSpace/XPlane protobuf module, to read ``.xplane.pb`` files.

    Not public API: TensorFlow ships it as ``tensorflow.tsl.profiler.protobuf.xplane_pb2`` (2.14 and
    2.21 alike), and the profiler's own packages do not ship the message at all.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


def step_trace(name: str, step: int) -> ContextManager[Any]:
    """The step annotation Keras' ``fit`` puts around each training step, for a custom loop's step.

    ``tf.profiler.experimental.Trace(name, step_num=n, _r=1)`` is how ``fit`` does it; ``_r=1`` (a
    private argument: a root event) makes the profiler's step analysis cut steps by it.
    """
    import tensorflow as tf

    return tf.profiler.experimental.Trace(name, step_num=step, _r=1)


def callback_list_calling(callback: Any) -> Any:
    """The Keras ``CallbackList`` whose hook is calling ``callback``'s hook, or None.

    Call it from the hook itself: the list is read from the frame that called the hook (two up from
    here). Keras does not tell a callback which list holds it, and the profiling callback needs that
    list to switch its per-step dispatch.
    """

    owner = sys._getframe(2).f_locals.get("self")
    if isinstance(owner, keras2().callbacks.CallbackList) and any(c is callback for c in owner.callbacks):
        return owner
    return None


def implements_train_batch_hooks(callback: Any) -> bool:
    """Whether ``callback`` overrides the per-step train hooks (``Callback._implements_train_batch_hooks``,
    what Keras itself asks to decide whether to dispatch them)."""
    return bool(callback._implements_train_batch_hooks())


def set_train_batch_hooks(callbacks: Any, needed: bool) -> None:
    """Tells a ``CallbackList`` whether to dispatch per-step train hooks at all
    (``CallbackList._should_call_train_batch_hooks``): off, a step costs nothing for the callbacks."""
    callbacks._should_call_train_batch_hooks = needed


def cluster_coordinator(model: Any) -> Any:
    """The ``ClusterCoordinator`` ``fit`` made for ``model`` under a parameter-server strategy, or None
    (tf_keras keeps it as ``model._cluster_coordinator``; there is no public accessor)."""
    return getattr(model, "_cluster_coordinator", None)


def uses_coordinator(strategy: Any) -> bool:
    """Whether ``strategy`` runs steps through a ``ClusterCoordinator`` (a parameter-server strategy),
    as ``fit`` decides it (``Strategy._should_use_with_coordinator``)."""
    return bool(getattr(strategy, "_should_use_with_coordinator", False))


def cluster_resolver(strategy: Any) -> Any:
    """The strategy's cluster resolver, or None. ``ParameterServerStrategy`` keeps it to itself in
    TensorFlow 2.14 (its public ``cluster_resolver`` is None there), as ``_cluster_resolver``."""
    return getattr(strategy, "cluster_resolver", None) or getattr(strategy, "_cluster_resolver", None)
