"""Cutting a chain of layers into consecutive pipeline stages.

Stages are cut at given layer indices, or balanced: the cut that makes the heaviest stage as
light as possible (the linear partition problem, solved by dynamic programming), weighing each
layer by its trainable parameter count unless told otherwise.

The cut itself is :mod:`tensorfleet.model_parallel.partition`'s, which the planner's memory model
uses too.

Example:
    >>> partition_layers(list("abcde"), 2, weights=[10, 1, 1, 1, 14])
    [['a', 'b', 'c', 'd'], ['e']]
"""

from __future__ import annotations

from tensorfleet.model_parallel.partition import param_count, partition_layers

__all__ = ["param_count", "partition_layers"]
