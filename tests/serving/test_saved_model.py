"""export(): TF Serving's versioned layout, a serving_default signature with stated names, the
model's own outputs back from the SavedModel, also for a model built under MirroredStrategy."""

from __future__ import annotations

import pytest

from .conftest import assert_float32_close


def _signature(path):
    import tensorflow as tf

    return tf.saved_model.load(str(path)).signatures["serving_default"]


def test_export_writes_the_versioned_layout_and_states_the_names(tmp_path, digits_models, images):
    import tensorflow as tf

    from tensorfleet.serving import export

    model = digits_models[1]
    result = export(model, tmp_path / "digits", version=3)
    assert result.path == tmp_path / "digits" / "3"
    assert sorted(p.name for p in (tmp_path / "digits").iterdir()) == ["3"]  # no temporary directory left
    assert (result.path / "saved_model.pb").is_file()
    assert [str(t) for t in result.inputs] == ["image: float32[None, 8, 8, 1]"]
    assert [str(t) for t in result.outputs] == ["logits: float32[None, 10]"]
    assert result.summary().splitlines() == [
        f"exported version 3 to {result.path} (signature 'serving_default')",
        "  input  image: float32[None, 8, 8, 1]",
        "  output logits: float32[None, 10]",
    ]
    out = _signature(result.path)(image=tf.constant(images))["logits"].numpy()
    assert_float32_close(out, model.predict(images, verbose=0))


def test_export_takes_other_names_and_refuses_an_existing_version(tmp_path, digits_models):
    from tensorfleet.serving import export

    result = export(digits_models[1], tmp_path, version=1, input_names=["pixels"], output_names="scores")
    assert [t.name for t in result.inputs + result.outputs] == ["pixels", "scores"]
    with pytest.raises(FileExistsError, match="Version 1 already exists"):
        export(digits_models[1], tmp_path, version=1)
    with pytest.warns(DeprecationWarning, match="export: 'base_dir' is now 'base_path'"), \
            pytest.raises(FileExistsError, match="Version 1 already exists"):
        export(digits_models[1], base_dir=tmp_path, version=1)  # the older keyword, for one release
    assert export(digits_models[2], tmp_path, version=1, overwrite=True).version == 1
    with pytest.raises(ValueError, match=r"version must be a positive integer. Received: version=0"):
        export(digits_models[1], tmp_path, version=0)
    with pytest.raises(ValueError, match=r"input_names must name each of the model's 1 tensors"):
        export(digits_models[1], tmp_path, version=5, input_names=["a", "b"])


def test_a_model_built_under_mirrored_strategy_exports_its_own_outputs(tmp_path, images, logical_cpus):
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.serving import export

    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2])
    with strategy.scope():
        model = tfl.models.build("digits_cnn", seed=5, keras="tf_keras")  # tf_keras: its variables are TF's own
    assert type(model.variables[0]).__name__ == "MirroredVariable"
    result = export(model, tmp_path / "mirrored", version=1)
    out = _signature(result.path)(image=tf.constant(images))["logits"].numpy()
    assert_float32_close(out, model.predict(images, verbose=0))


def test_the_exported_version_is_readable_as_the_umask_allows(tmp_path, digits_models):
    import os

    from tensorfleet.serving import export

    old = os.umask(0o022)
    try:
        result = export(digits_models[1], tmp_path / "digits", version=1)
    finally:
        os.umask(old)
    assert oct(result.path.stat().st_mode & 0o777) == "0o755"  # mkdtemp's 0700 kept TF Serving's user out

