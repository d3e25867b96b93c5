"""The side-car evaluator with a Keras 3 model (the ``keras`` package, installed beside tf_keras on the current
track): the trainer's callback writes TensorFlow checkpoints of the Keras 3 model, and the evaluator restores and
evaluates each one as it does a tf_keras model's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet.cluster.evaluation import BEST_MODEL, checkpoint_callback, evaluated_checkpoints, evaluation


def test_the_side_car_evaluator_evaluates_each_checkpoint_of_a_keras3_model(keras3: Any, tmp_path: Path) -> None:
    from tensorfleet.compat.keras import load_model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)

    def model_fn() -> Any:
        keras3.utils.set_random_seed(0)
        model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
        model.compile(optimizer=keras3.optimizers.Adam(0.05),
                      loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    trained, after = model_fn(), []

    class Keep(keras3.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            after.append(self.model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True))

    lines: list[str] = []
    # Trained for 2 epochs, then 1 more: each time the evaluator takes the newest checkpoint, as SidecarEvaluator does.
    for epochs in (2, 3):
        trained.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=epochs - 2 if epochs == 2 else 2, verbose=0,
                    shuffle=False, callbacks=[checkpoint_callback(tmp_path / "ckpt", keras="keras3"), Keep()])
        assert evaluation(model_fn, (x, y), checkpoint_dir=tmp_path / "ckpt", out_dir=tmp_path / "eval",
                          last_checkpoint=epochs, force=True, log=lines.append)
    rows = evaluated_checkpoints(tmp_path / "eval")
    assert [(r["checkpoint"], r["step"]) for r in rows] == [(2, 8), (3, 12)], lines
    for row, logs in zip(rows, after[1:]):  # the evaluator's numbers are the trained model's at that epoch
        assert row["loss"] == pytest.approx(logs["loss"], rel=1e-5, abs=1e-6)
        assert row["accuracy"] == pytest.approx(logs["accuracy"], abs=1e-7)
    best = load_model(tmp_path / "eval" / BEST_MODEL)
    assert isinstance(best, keras3.Model)
    best_row = max(rows, key=lambda r: r["accuracy"])
    assert best.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)["accuracy"] == \
        pytest.approx(best_row["accuracy"], abs=1e-7)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "eval" / "tensorboard").rglob("*"))


def test_the_checkpoint_callback_takes_only_a_known_keras(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"keras must be one of 'keras3', 'keras2' .* Received: keras='jax'"):
        checkpoint_callback(tmp_path, keras="jax")
