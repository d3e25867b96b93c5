"""Warm-up records: TF Serving's ``assets.extra/tf_serving_warmup_requests``, written and replayed.

The file is a TFRecord of ``PredictionLog`` protos, each holding a ``PredictRequest`` (TF Serving
reads at most 1,000). A version's records are replayed once each on the loaded model before the
version, or a new replica of it, takes traffic, so the first request does not pay for tracing
and kernel selection. :func:`write` makes the file from example inputs (``export(...,
warmup=...)`` calls it).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tensorfleet.validation import integer

__all__ = ["MAX_RECORDS", "WARMUP_FILE", "read", "replay", "write"]

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_RECORDS = 1000  # TF Serving's limit (kMaxNumRecordsInWarmupFile)


def write(version_dir: str | os.PathLike[str], examples: Sequence[Mapping[str, np.ndarray]], *,
          model_name: str = "model", signature_name: str = "serving_default") -> Path:
    """Writes one PredictLog record per example (a dict of input name to array, batch axis first)
    to ``version_dir/assets.extra/tf_serving_warmup_requests``, atomically; returns the path."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    if not 1 <= len(examples) <= MAX_RECORDS:
        raise ValueError(f"warmup takes 1 to {MAX_RECORDS} examples (TF Serving reads at most {MAX_RECORDS}). "
                         f"Received: {len(examples)} examples")
    records = []
    for example in examples:
        if not isinstance(example, Mapping) or not example:
            raise ValueError("Each warm-up example is a dict of input name to array, e.g. {'image': x[:1]}. "
                             f"Received: {type(example).__name__}")
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = model_name, signature_name
        for name, value in example.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        records.append(log.SerializeToString())
    path = Path(version_dir) / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")  # renamed into place once whole
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for record in records:
                writer.write(record)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read(version_dir: str | os.PathLike[str]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(signature name, inputs) of each PredictLog record in the version's warm-up file (none if absent).

    Raises:
        SavedModelError: the file is not a TFRecord file of PredictionLog records (damaged, truncated, another
            kind of file, a folder); the message names it.
    """
    from tensorfleet.serving.servable import SavedModelError

    path = Path(version_dir) / WARMUP_FILE
    if path.exists() and not path.is_file():
        raise SavedModelError(f"{path} is a folder; expected the version's warm-up file (a TFRecord file of "
                              "PredictionLog records) or nothing")
    if not path.is_file():
        return []
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow_serving.apis import prediction_log_pb2

    try:
        raws = [raw.numpy() for raw in tf.data.TFRecordDataset(str(path)).take(MAX_RECORDS + 1)]
        logs = [prediction_log_pb2.PredictionLog.FromString(raw) for raw in raws]
    except (tf.errors.OpError, DecodeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
        raise SavedModelError(f"{path} is not a TFRecord file of PredictionLog warm-up records "
                              f"({type(error).__name__}: {first}); expected what tfl.serving.warmup.write "
                              "writes") from None
    out = []
    for log in logs:
        if log.WhichOneof("log_type") != "predict_log":
            raise ValueError(f"{path}: only PredictLog warm-up records are served (Predict is the one API). "
                             f"Received a {log.WhichOneof('log_type')} record")
        request = log.predict_log.request
        out.append((request.model_spec.signature_name or "serving_default",
                    {k: tf.make_ndarray(v) for k, v in request.inputs.items()}))
    if len(out) > MAX_RECORDS:
        raise ValueError(f"{path} holds more than {MAX_RECORDS} records (TF Serving's limit)")
    return out


def replay(servable: Any) -> int:
    """Runs each warm-up record of ``servable``'s version once (checked as a request is); returns how many."""
    from tensorfleet.serving.errors import ServingError
    from tensorfleet.serving.servable import SavedModelError

    records = read(servable.path)
    for signature_name, inputs in records:
        try:
            signature = servable.signature(signature_name)
            checked = signature.check(inputs, strict_dtype=True)
        except ServingError as error:  # a request's error at load time: the warm-up file does not fit the model
            raise SavedModelError(f"{servable.path / WARMUP_FILE}: a warm-up record does not fit version "
                                  f"{servable.version}: {error}") from None
        servable.run(signature.name, checked)
    servable.warmup_records = integer("warmup_records", len(records), minimum=0)
    return len(records)
