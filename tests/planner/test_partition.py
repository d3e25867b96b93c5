"""The pipeline and the planner's memory model cut stages with one function,
``model_parallel.partition``'s (the planner imports model_parallel, never the other way round:
tests/test_layout.py)."""

from __future__ import annotations

from tensorfleet.model_parallel.partition import partition_layers
from tensorfleet.model_parallel.pipeline import partition_layers as pipeline_partition
from tensorfleet.planner.memory import split_stages


def test_the_pipeline_and_the_memory_model_cut_stages_with_one_function():
    assert pipeline_partition is partition_layers
    assert partition_layers(list("abcdef"), 3, weights=[1, 1, 1, 5, 1, 1]) == [["a", "b", "c"], ["d"], ["e", "f"]]
    assert split_stages([1, 1, 1, 5, 1, 1], 3) == [[0, 1, 2], [3], [4, 5]]

