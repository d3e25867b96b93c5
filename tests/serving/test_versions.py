"""Versions while serving: a new version exported under load is loaded, warmed up and switched to
with no failed request (each answer is its version's model's, to float32 rounding), the old one is drained
and unloaded; a broken version is refused and the current one keeps serving."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from .conftest import assert_float32_close, start_server


def _wait(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.slow
def test_a_new_version_is_switched_to_under_load_and_a_broken_one_refused(tmp_path, digits_models, images):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tensorfleet.serving import export

    base = tmp_path / "digits"
    export(digits_models[1], base, version=1)
    log: list[str] = []
    server = start_server(base, poll_seconds=0.2, log=log.append)
    expected = {v: m.predict(images, verbose=0) for v, m in digits_models.items()}
    answers: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    done = threading.Event()

    def caller(k: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            n = 0
            while not done.is_set():
                i = (k * 13 + n) % 60
                request = predict_pb2.PredictRequest()
                request.model_spec.name = "digits"
                request.inputs["image"].CopyFrom(tf.make_tensor_proto(images[i:i + 2]))
                try:
                    reply = stub.Predict(request, timeout=30)
                    answers[k].append((reply.model_spec.version.value, i, tf.make_ndarray(reply.outputs["logits"])))
                except BaseException as exc:  # noqa: BLE001 - every failure is reported below
                    errors.append(exc)
                n += 1

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        export(digits_models[2], base, version=2, warmup=images[:5])
        switched = _wait(lambda: all(a and a[-1][0] == 2 for a in answers))
        time.sleep(0.3)
        done.set()
        for thread in threads:
            thread.join(30)
        assert switched and errors == []
        for per_caller in answers:
            versions = [v for v, _, _ in per_caller]
            assert versions == sorted(versions) and set(versions) == {1, 2}  # once on 2, never back to 1
            for version, i, logits in per_caller:
                assert_float32_close(logits, expected[version][i:i + 2])
        assert _wait(lambda: server.versions == [2])
        assert "version 2 loaded, warmed up and serving" in log and "version 1 unloaded" in log
        assert server.repository.get("digits").warmup_records == 5  # its records, replayed before the switch

        (base / "3").mkdir()
        (base / "3" / "saved_model.pb").write_bytes(b"not a SavedModel")
        assert _wait(lambda: any(line.startswith("version 3 refused: ") for line in log))
        assert server.versions == [2]
        assert server.repository.get("digits").version == 2
    finally:
        done.set()
        server.stop()
