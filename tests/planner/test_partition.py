"""The planner is the lower room: the pipeline cuts its stages with the planner's partition, and no
planner module imports ``tensorfleet.model_parallel`` (the two imported each other before)."""

from __future__ import annotations

import ast
from pathlib import Path

from tensorfleet.model_parallel.pipeline import partition_layers as pipeline_partition
from tensorfleet.planner.memory import split_stages
from tensorfleet.planner.partition import partition_layers

PLANNER = Path(__file__).resolve().parents[2] / "tensorfleet" / "planner"


def test_the_pipeline_and_the_memory_model_cut_stages_with_one_function():
    assert pipeline_partition is partition_layers
    assert partition_layers(list("abcdef"), 3, weights=[1, 1, 1, 5, 1, 1]) == [["a", "b", "c"], ["d"], ["e", "f"]]
    assert split_stages([1, 1, 1, 5, 1, 1], 3) == [[0, 1, 2], [3], [4, 5]]


def test_no_planner_module_imports_model_parallel():
    reaches = []
    for path in sorted(PLANNER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            reaches += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("tensorfleet.model_parallel")]
    assert len(list(PLANNER.rglob("*.py"))) >= 10 and reaches == []
