"""The profiler's converter where the installed release keeps it (tensorfleet.compat.profiler)."""

from __future__ import annotations

import json
from importlib.metadata import version

from tensorfleet.compat.profiler import converter_name, trace_viewer_json, xplane_pb2


def test_the_converter_is_xprof_on_todays_tensorflow_and_the_plugin_on_2_14():
    major, minor = (int(part) for part in version("tensorflow").split(".")[:2])
    assert converter_name() == ("xprof" if (major, minor) >= (2, 16) else "tensorboard_plugin_profile")


def test_a_recorded_xspace_becomes_chrome_trace_events_with_the_train_steps(recorded):
    logdir, callback = recorded
    (path,) = sorted(callback.directory.rglob("*.xplane.pb"))
    space = xplane_pb2().XSpace()
    space.ParseFromString(path.read_bytes())
    assert any(plane.name == "/host:CPU" for plane in space.planes)
    events = json.loads(trace_viewer_json(str(path)))["traceEvents"]
    steps = [e for e in events if e.get("args", {}).get("step_name", "").startswith("train ")]
    assert sorted(int(e["args"]["step_num"]) for e in steps) == list(range(3, 13))
    assert all(e["ph"] == "X" and e["dur"] > 0 for e in steps)
