"""Train, export and serve a digits classifier, then query it as TF Serving's users do.

The script trains the digits CNN, a Keras 3 model (``import keras``; a tf_keras model serves the
same way, with the same signature), for a few epochs, exports it in TF Serving's versioned layout
(``OUT/digits/1``), serves it with dynamic batching on free ports of 127.0.0.1, and asks it from
16 concurrent callers, half over REST (plain HTTP and JSON) and half over gRPC (TF Serving's own
``PredictionServiceStub``). It checks that every answer equals ``model.predict`` to float32 rounding
(the server runs batches of other sizes, which some CPUs sum in another order), prints the
served accuracy and how many signature calls the batcher needed, then trains one epoch more,
saves it as ``digits.keras``, exports that file as version 2 while serving, waits for the server to
switch to it and asks again. The same from the shell:

    tensorfleet serving export digits.keras models/digits --version 1
    tensorfleet serve models/digits --enable-batching --max-batch-size 32 --batch-timeout-micros 2000

Run with ``python examples/serve_digits.py [--epochs 3] [--out runs/serve_digits]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def assert_float32_close(served, predicted) -> None:
    """Served logits equal ``model.predict``'s up to float32 rounding: the server runs the model on batches
    of other sizes, and some CPUs (AVX2 without AVX-512) sum those in another order (6e-8 to 7.5e-8 apart)."""
    import numpy as np

    scale = max(1.0, float(np.max(np.abs(predicted))))
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-5 * scale)


def ask_rest(port: int, images, version: int | None = None):
    import numpy as np

    path = f"/v1/models/digits{'' if version is None else f'/versions/{version}'}:predict"
    body = json.dumps({"instances": images.tolist()}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body),
                                timeout=30) as reply:
        return np.array(json.loads(reply.read())["predictions"], np.float32)


def ask_grpc(port: int, images):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return tf.make_ndarray(reply.outputs["logits"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default="runs/serve_digits")
    args = parser.parse_args()

    import keras
    import numpy as np
    import portpicker

    import tensorfleet as tfl
    from tensorfleet.serving import BatchingOptions, ModelServer, export, load_keras_model

    data = tfl.models.load_digits()
    model = tfl.models.build("digits_cnn", seed=0, keras="keras3")  # keras="keras2": the same CNN in tf_keras
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(data.x_train, data.y_train, epochs=args.epochs, batch_size=32, verbose=0)
    base = os.path.join(args.out, "digits")
    print(export(model, base, version=1, overwrite=True).summary())

    batching = BatchingOptions(max_batch_size=32, batch_timeout_micros=2000, num_batch_threads=1)
    server = ModelServer(base, model_name="digits", port=portpicker.pick_unused_port(),
                         rest_api_port=portpicker.pick_unused_port(), batching=batching, poll_seconds=0.5,
                         log=lambda line: print(f"[serve] {line}")).start()
    try:
        x, y = data.x_test[:128], data.y_test[:128]
        chunks = np.array_split(np.arange(len(x)), 16)  # 16 callers of 8 images each, half REST, half gRPC

        def ask(i: int):
            rows = x[chunks[i]]
            return ask_rest(server.rest_api_port, rows) if i % 2 else ask_grpc(server.port, rows)

        servable = server.repository.get("digits")
        with ThreadPoolExecutor(16) as pool:
            logits = np.concatenate(list(pool.map(ask, range(16))))
        assert_float32_close(logits, model.predict(x, verbose=0))
        print(f"version 1: 16 concurrent requests (8 REST, 8 gRPC) answered as model.predict (to float32 rounding), "
              f"served accuracy {np.mean(logits.argmax(1) == y):.3f}, in {servable.calls} signature call(s)")

        model.fit(data.x_train, data.y_train, epochs=1, batch_size=32, verbose=0)
        saved = os.path.join(args.out, "digits.keras")
        model.save(saved)  # a Keras 3 file: read back by Keras 3, as `tensorfleet serving export` reads it
        export(load_keras_model(saved), base, version=2, overwrite=True)
        deadline = time.monotonic() + 60
        while server.versions != [2] and time.monotonic() < deadline:
            time.sleep(0.2)
        logits = ask_rest(server.rest_api_port, x)
        assert_float32_close(logits, model.predict(x, verbose=0))
        print(f"version 2: served after the switch (versions {server.versions}), "
              f"accuracy {np.mean(logits.argmax(1) == y):.3f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
