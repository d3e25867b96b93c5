"""Planning a parallel job before running it: what fits in memory and what is fastest.

* :func:`plan` ranks data, tensor, pipeline and hybrid layouts for a model on the devices at hand
  (:mod:`tensorfleet.planner.plans`; ``tfl.planner.plan`` is the function); the layouts are the
  entries of :data:`tensorfleet.planner.layouts.LAYOUTS`, the models they are costed for are
  :mod:`~tensorfleet.planner.workload`\\ s.
* ``plan(...).mesh()`` is the recommended layout as a mesh, ``plan(...).run("script.py")`` runs a script
  under it (:func:`planned_mesh` inside); :mod:`~tensorfleet.planner.run_report` sets what the run
  holds per device beside the prediction (:mod:`~tensorfleet.planner.runs`).
* :mod:`~tensorfleet.planner.memory`: per-device memory of training a model (the savers that
  change it are :mod:`tensorfleet.strategies.memory_savers`); :mod:`~tensorfleet.planner.splits`:
  the model states of a layout that splits only some weights, weight by weight.
* :mod:`~tensorfleet.planner.cost_model`: the alpha-beta cost of collective communication;
  :mod:`~tensorfleet.planner.fit_check` judges a link fitted to measurements on held-out sizes.
* :mod:`~tensorfleet.planner.collectives`: the all-reduce algorithms themselves, run over
  logical devices with real tensors; :mod:`~tensorfleet.planner.traffic`: what they send, by formula.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach

__getattr__, _LAZY = attach(
    __name__,
    names={"plan": "plans", "Plan": "plans", "TrainingOptions": "plans", "Workload": "workload", "planned_mesh": "runs",
           "RunReport": "run_report",
           "estimate_memory": "memory:estimate", "plot_layers": "memory", "zero_bytes_per_parameter": "memory",
           "Link": "cost_model", "predict": "cost_model", "predict_hierarchical": "cost_model",
           "fit_link": "cost_model",
           "last_level_cache_bytes": "cost_model", "check_link": "fit_check", "all_reduce": "collectives"},
    internal=("collectives", "cost_model", "fit_check", "layouts", "memory", "partition", "plans", "run_report", "runs",
              "splits", "traffic", "workload"),
)

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.planner.collectives import all_reduce
    from tensorfleet.planner.cost_model import Link, fit_link, last_level_cache_bytes, predict, predict_hierarchical
    from tensorfleet.planner.fit_check import check_link
    from tensorfleet.planner.memory import estimate as estimate_memory, plot_layers, zero_bytes_per_parameter
    from tensorfleet.planner.plans import Plan, TrainingOptions, plan
    from tensorfleet.planner.run_report import RunReport
    from tensorfleet.planner.runs import planned_mesh
    from tensorfleet.planner.workload import Workload

__all__ = [*_LAZY]
