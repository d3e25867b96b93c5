"""A Keras 3 model (the ``keras`` package, installed beside tf_keras on the current track) built by the side-car
evaluator's ``model_fn`` gets one clear error before anything is evaluated or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensorfleet.cluster.evaluation import evaluation
from tensorfleet.compat.keras import Keras3ModelError


def test_the_side_car_evaluator_refuses_a_keras3_model(keras3: Any, tmp_path: Path) -> None:
    import numpy as np

    def model_fn() -> Any:
        model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
        model.compile(loss="mse")
        return model

    data = (np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32))
    with pytest.raises(Keras3ModelError, match=r"^tensorfleet\.cluster\.evaluation\.evaluation \(the model model_fn "
                                               r"built\) runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model \(keras\.src\.models\.sequential\."
                                               r"Sequential\)\. For Keras 2, build the model with `import tf_keras as keras`"):
        evaluation(model_fn, data, checkpoint_dir=tmp_path / "ckpt", out=tmp_path / "eval", force=True)
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == []  # nothing evaluated, nothing written
