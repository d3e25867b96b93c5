"""Low-rank decomposition side by side: three models before and after tfl.edge.decompose.

* a Dense-heavy MLP on the digits (64-512-512-256-10), ``svd`` at rank 32;
* a CNN with ResNet-style blocks (a 64-filter stem, two residual blocks of two 3x3 convolutions)
  on the 8x8 digits, the blocks' convolutions by ``tucker2`` with the ranks VBMF picks (Kim et
  al., 2016);
* the MLPerf Tiny DS-CNN for keyword spotting on generated keyword-shaped data (trained as
  bench/edge_quantization.py trains it), ``tucker2`` at rank 16 (its 1x1 convolutions by SVD and
  the first convolution; the depthwise layers stay).

For each: parameters, FLOPs (a multiply-accumulate is two) of all layers and of the
convolutions alone, ``.tflite`` bytes in float32 and int8, LiteRT latency at batch 1 (float32
and int8; the two models alternate in rounds, each round the median of many invokes, and the
median over rounds is reported), the smallest TFLM arena of the int8 model, and Keras accuracy
before, right after decomposition and after one epoch of fine-tuning.

Targets (issue 30): >= 3x fewer parameters on the MLP; >= 2x fewer convolution FLOPs on the CNN
with >= 1.5x LiteRT speed-up; at most 1 point of accuracy lost after fine-tuning, each model.

Run: .venv/bin/python bench/decomposition.py [--rounds 15] [--invokes 200]
Writes docs/decomposition.png (the three models) and docs/decomposition_plan.png (the CNN's plan).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

import tensorfleet  # noqa: E402,F401  (tf.keras is tf_keras from here on)

DOCS = Path(__file__).resolve().parent.parent / "docs"


class Case(NamedTuple):
    name: str
    build: Any
    data: tuple[Any, Any, Any, Any]
    method: str
    rank: Any
    epochs: int
    logits: bool
    layers: Any = None
    rates: tuple[float, float] = (1e-3, 5e-4)  # Adam's learning rate for training, for the fine-tuning epoch


def _mlp() -> Any:
    import tensorflow as tf

    inputs = tf.keras.Input((64,), name="pixels")
    x = inputs
    for i, units in enumerate((512, 512, 256)):
        x = tf.keras.layers.Dense(units, activation="relu", name=f"dense{i}")(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10, name="logits")(x), name="mlp")


def _resnet_cnn(filters: int = 64) -> Any:
    import tensorflow as tf

    layers = tf.keras.layers
    inputs = tf.keras.Input((8, 8, 1), name="image")
    x = layers.Conv2D(filters, 3, padding="same", activation="relu", name="stem")(inputs)
    for block in range(2):
        y = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"block{block}_a")(x)
        y = layers.Conv2D(filters, 3, padding="same", name=f"block{block}_b")(y)
        x = layers.Activation("relu")(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, layers.Dense(10, name="logits")(x), name="resnet_cnn")


def _cases() -> list[Case]:
    from tensorfleet import models
    from tensorfleet.models import tinyml

    digits = models.datasets.load_digits()
    flat = models.datasets.load_digits(flat=True)
    kws_train, kws_test = tinyml.synthetic("ds_cnn", n=1500, seed=1), tinyml.synthetic("ds_cnn", n=400, seed=2)
    return [
        Case("mlp", _mlp, (flat.x_train, flat.y_train, flat.x_test, flat.y_test), "svd", 32, 20, True),
        Case("resnet_cnn", _resnet_cnn, (digits.x_train, digits.y_train, digits.x_test, digits.y_test),
             "tucker2", "vbmf", 10, True, [f"block{b}_{c}" for b in range(2) for c in "ab"]),
        Case("ds_cnn", lambda: models.build("ds_cnn"), (kws_train.x, kws_train.y, kws_test.x, kws_test.y),
             "tucker2", 16, 10, False, rates=(3e-3, 1e-3)),
    ]


def _compile(model: Any, logits: bool, lr: float) -> Any:
    import tensorflow as tf

    model.compile(optimizer=tf.keras.optimizers.Adam(lr), metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=logits))
    return model


def _accuracy(model: Any, x: Any, y: Any) -> float:
    return float(np.mean(np.argmax(model.predict(x, batch_size=256, verbose=0), axis=-1) == y))


def _flops(artifact: Any) -> tuple[int, int]:
    """All FLOPs and convolution FLOPs (CONV_2D, DEPTHWISE_CONV_2D) of one example, from the flatbuffer."""
    from tensorfleet.edge.report import layer_table

    rows = layer_table(artifact)
    conv = sum(r.macs for r in rows if r.op in ("CONV_2D", "DEPTHWISE_CONV_2D"))
    return 2 * sum(r.macs for r in rows), 2 * conv


def _latencies(contents: list[bytes], sample: np.ndarray, rounds: int, invokes: int) -> list[float]:
    """Median seconds per batch-1 invoke of each model, the models alternating round by round."""
    from tensorfleet.compat.litert import make_interpreter

    interpreters = []
    for content in contents:
        interpreter = make_interpreter(content)
        interpreter.allocate_tensors()
        detail = interpreter.get_input_details()[0]
        data = sample[None].astype(np.float32)
        if detail["dtype"] == np.int8:
            scale, zero = detail["quantization"]
            data = np.clip(np.round(data / scale + zero), -128, 127).astype(np.int8)
        interpreter.set_tensor(detail["index"], data)
        for _ in range(20):
            interpreter.invoke()
        interpreters.append(interpreter)
    per_round: list[list[float]] = [[] for _ in contents]
    for _ in range(rounds):
        for times, interpreter in zip(per_round, interpreters):
            samples = []
            for _ in range(invokes):
                start = time.perf_counter()
                interpreter.invoke()
                samples.append(time.perf_counter() - start)
            times.append(float(np.median(samples)))
    return [float(np.median(times)) for times in per_round]


def _artifacts(model: Any, x: Any) -> dict[str, Any]:
    from tensorfleet import edge

    return {mode: edge.convert(model, mode, x, num_calibration_samples=100, progress=False)
            for mode in ("float32", "int8")}


def _measure(case: Case, rounds: int, invokes: int) -> dict[str, Any]:
    import tensorflow as tf

    from tensorfleet import edge

    x_train, y_train, x_test, y_test = case.data
    tf.keras.utils.set_random_seed(0)
    model = _compile(case.build(), case.logits, case.rates[0])
    model.fit(x_train, y_train, epochs=case.epochs, batch_size=32, verbose=0)
    plan = edge.plan_decomposition(model, case.method, rank=case.rank, layers=case.layers)
    print(plan.describe(), flush=True)
    if case.name == "resnet_cnn":
        plan.plot(DOCS / "decomposition_plan.png")
    small = _compile(edge.decompose(model, plan=plan), case.logits, case.rates[1])
    accuracy = {"before": _accuracy(model, x_test, y_test), "decomposed": _accuracy(small, x_test, y_test)}
    small.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0)
    accuracy["fine-tuned"] = _accuracy(small, x_test, y_test)
    arts = {"before": _artifacts(model, x_train), "after": _artifacts(small, x_train)}
    row: dict[str, Any] = {"name": case.name, "method": case.method, "rank": case.rank, "accuracy": accuracy,
                           "params": (model.count_params(), small.count_params())}
    row["flops"] = tuple(_flops(arts[k]["float32"]) for k in ("before", "after"))
    row["bytes"] = {mode: tuple(arts[k][mode].size for k in ("before", "after")) for mode in ("float32", "int8")}
    row["arena"] = tuple(edge.find_arena_size(arts[k]["int8"], progress=False) for k in ("before", "after"))
    sample = np.asarray(x_test[0], np.float32)
    row["latency"] = {mode: tuple(_latencies([arts["before"][mode].data, arts["after"][mode].data], sample,
                                             rounds, invokes)) for mode in ("float32", "int8")}
    return row


def _print(row: dict[str, Any]) -> None:
    (p0, p1), ((f0, c0), (f1, c1)) = row["params"], row["flops"]
    acc = row["accuracy"]
    print(f"\n{row['name']} ({row['method']}, rank {row['rank']})")
    print(f"  parameters        {p0:>12,} -> {p1:>12,}   {p0 / p1:.2f}x fewer")
    print(f"  FLOPs (all)       {f0:>12,} -> {f1:>12,}   {f0 / f1:.2f}x fewer")
    if c0:
        print(f"  FLOPs (conv)      {c0:>12,} -> {c1:>12,}   {c0 / c1:.2f}x fewer")
    for mode in ("float32", "int8"):
        b0, b1 = row["bytes"][mode]
        t0, t1 = row["latency"][mode]
        print(f"  .tflite {mode:<8}  {b0:>12,} -> {b1:>12,} B {b0 / b1:.2f}x smaller; LiteRT batch 1 "
              f"{t0 * 1e6:8.1f} -> {t1 * 1e6:8.1f} us  {t0 / t1:.2f}x faster")
    a0, a1 = row["arena"]
    print(f"  TFLM arena (int8) {a0:>12,} -> {a1:>12,} B")
    print(f"  accuracy          before {acc['before']:.4f}, decomposed {acc['decomposed']:.4f}, after one epoch "
          f"of fine-tuning {acc['fine-tuned']:.4f} ({100 * (acc['fine-tuned'] - acc['before']):+.2f} points)")


def _plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensorfleet.io import save_figure

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    names = [r["name"] for r in rows]
    x = np.arange(len(rows))
    panels = [("parameters", [r["params"] for r in rows]),
              ("convolution + dense FLOPs", [(r["flops"][0][0], r["flops"][1][0]) for r in rows]),
              ("LiteRT float32 latency, batch 1 (us)",
               [tuple(t * 1e6 for t in r["latency"]["float32"]) for r in rows]),
              ("int8 .tflite bytes", [r["bytes"]["int8"] for r in rows])]
    for ax, (title, pairs) in zip(axes, panels):
        before, after = zip(*pairs)
        ax.bar(x - 0.2, before, 0.4, label="before", color="tab:gray")
        ax.bar(x + 0.2, after, 0.4, label="decomposed", color="tab:blue")
        for i, (b, a) in enumerate(pairs):
            ax.annotate(f"{b / a:.1f}x", (i + 0.2, a), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, names)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle("tfl.edge.decompose: before and after (accuracy after one epoch of fine-tuning: "
                 + ", ".join(f"{r['name']} {100 * r['accuracy']['fine-tuned']:.1f}%" for r in rows) + ")",
                 fontsize=10)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--invokes", type=int, default=200)
    parser.add_argument("--only", choices=[c.name for c in _cases()], default=None)
    args = parser.parse_args(argv)
    import tensorflow as tf

    from tensorfleet.compat.litert import interpreter_source

    print(f"TensorFlow {tf.__version__}, interpreter {interpreter_source()}, Python {sys.version.split()[0]}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    rows = []
    for case in _cases():
        if args.only in (None, case.name):
            rows.append(_measure(case, args.rounds, args.invokes))
            _print(rows[-1])
    if args.only is None:
        print(f"\nwrote {_plot(rows, DOCS / 'decomposition.png')}")
    targets = {r["name"]: r for r in rows}
    checks = []
    if "mlp" in targets:
        p0, p1 = targets["mlp"]["params"]
        checks.append(("mlp >= 3x fewer parameters", p0 / p1 >= 3))
    if "resnet_cnn" in targets:
        r = targets["resnet_cnn"]
        checks.append(("resnet_cnn >= 2x fewer conv FLOPs", r["flops"][0][1] / r["flops"][1][1] >= 2))
        t0, t1 = r["latency"]["float32"]
        checks.append(("resnet_cnn >= 1.5x LiteRT float32 speed-up", t0 / t1 >= 1.5))
    for r in rows:
        checks.append((f"{r['name']} loses <= 1 point after fine-tuning",
                       r["accuracy"]["fine-tuned"] >= r["accuracy"]["before"] - 0.01))
    for label, ok in checks:
        print(f"{'met' if ok else 'NOT met'}: {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
