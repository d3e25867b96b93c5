"""Warm-up records and the model config file, with no model: the TFRecord of PredictionLog written
and read back exactly, TF Serving's 1,000-record limit, and ModelServerConfig's policies, labels,
paths and errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tensorfleet.serving.model_config import ModelEntry, read_model_config
from tensorfleet.serving.warmup import MAX_RECORDS, WARMUP_FILE, read, write


def test_warmup_records_are_written_as_predict_logs_and_read_back_exactly(tmp_path):
    examples = [{"image": np.arange(64, dtype=np.float32).reshape(1, 8, 8, 1) / 7},
                {"image": np.full((2, 8, 8, 1), -1.5, np.float32)}]
    path = write(tmp_path, examples, model_name="digits")
    assert path == tmp_path / WARMUP_FILE and path.parent.name == "assets.extra"
    records = read(tmp_path)
    assert [name for name, _ in records] == ["serving_default", "serving_default"]
    for (_, inputs), example in zip(records, examples):
        assert list(inputs) == ["image"] and inputs["image"].dtype == np.float32
        np.testing.assert_array_equal(inputs["image"], example["image"])  # serialized, not computed: exact
    assert read(tmp_path / "elsewhere") == []
    assert [p.name for p in path.parent.iterdir()] == ["tf_serving_warmup_requests"]  # no temporary left


def test_warmup_takes_1_to_1000_examples_of_named_arrays(tmp_path):
    with pytest.raises(ValueError, match=rf"warmup takes 1 to {MAX_RECORDS} examples .* Received: 1001 examples"):
        write(tmp_path, [{"x": np.zeros((1, 1))}] * (MAX_RECORDS + 1))
    with pytest.raises(ValueError, match=r"Each warm-up example is a dict of input name to array.*Received: ndarray"):
        write(tmp_path, [np.zeros((1, 2))])
    assert not (tmp_path / WARMUP_FILE).exists()


def test_the_model_config_file_gives_each_model_its_path_policy_and_labels(tmp_path):
    config = tmp_path / "conf" / "models.config"
    config.parent.mkdir()
    config.write_text("""model_config_list {
      config { name: "a" base_path: "models/a" model_platform: "tensorflow"
               model_version_policy { specific { versions: 2 versions: 5 } }
               version_labels { key: "stable" value: 2 } version_labels { key: "canary" value: 5 } }
      config { name: "b" base_path: "/srv/b" model_version_policy { latest { num_versions: 3 } } }
      config { name: "c" base_path: "c" model_version_policy { all {} } }
    }""")
    assert read_model_config(config) == [
        ModelEntry("a", config.parent / "models/a", "specific", 1, (2, 5), {"stable": 2, "canary": 5}),
        ModelEntry("b", Path("/srv/b"), "latest", 3, (), {}),
        ModelEntry("c", config.parent / "c", "all", 1, (), {})]


@pytest.mark.parametrize(("text", "message"), [
    ('model_config_list { config { name: "a" base_path: "x" } config { name: "a" base_path: "y" } }',
     "model names must differ. Received: ['a', 'a']"),
    ('model_config_list { config { name: "a" base_path: "x" model_platform: "pytorch" } }',
     "only model_platform \"tensorflow\" is served. Received: 'pytorch'"),
    ("", "is empty (0 bytes); expected a text-format ModelServerConfig"),
    ("# no model yet\n", "lists no model"),
    ("model_config_list { config { name: 1 ", "is not a text-format ModelServerConfig"),
])
def test_a_wrong_model_config_is_one_clear_error(tmp_path, text, message):
    config = tmp_path / "models.config"
    config.write_text(text)
    with pytest.raises(ValueError, match=r"^'?" + re.escape(str(config))) as info:
        read_model_config(config)
    assert message in str(info.value)
    with pytest.raises(FileNotFoundError,
                       match=r"No file at .*: nothing is there; expected a text-format ModelServerConfig"):
        read_model_config(tmp_path / "none.config")
