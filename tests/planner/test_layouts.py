"""The planner's layouts: registry entries with their own degrees, memory and time; a new one is planned."""

from __future__ import annotations

import pytest

from tensorfleet.planner import cost_model, layouts as L, plans as planner
from tensorfleet.planner.workload import transformer_workload

LINK = cost_model.Link(alpha=5e-6, beta=1 / 12.5e9)


def _setup(devices: int = 8, nodes: int = 1, batch_size: int = 64, layers: int = 24) -> L.PlanSetup:
    return L.PlanSetup(work=transformer_workload(1e9, layers=layers, hidden=1864, heads=8), batch_size=batch_size,
                       devices=devices, nodes=nodes, device_memory=80e9, intra=LINK, inter=LINK, device_tflops=100.0,
                       optimizer="adam", precision="mixed_float16", value_bytes=2, recompute=None)


def test_the_layouts_are_registry_entries_in_the_order_the_plan_lists_them():
    assert L.LAYOUTS.names() == ["data_allreduce", "data_ps", "tensor", "pipeline", "hybrid"]
    assert [L.LAYOUTS.canonical(a) for a in ("ps", "allreduce", "tensor_parallel", "pipeline_parallel")] == [
        "data_ps", "data_allreduce", "tensor", "pipeline"]
    assert isinstance(L.LAYOUTS.get("hybrid"), L.HybridLayout) and L.LAYOUTS.get("hybrid").name == "hybrid"


def test_each_layout_has_its_own_degrees_memory_and_communication():
    setup = _setup()
    allreduce, ps, tensor, pipeline = (L.LAYOUTS.get(n) for n in ("data_allreduce", "data_ps", "tensor", "pipeline"))
    data = L.Degrees(8, 1, 1)
    assert allreduce.degrees(setup) == ps.degrees(setup) == [data]
    assert tensor.degrees(setup) == [(1, 8, 1)] and pipeline.degrees(setup) == [(1, 1, 8)]
    assert allreduce.memory(setup, data, 1).optimizer_state == pytest.approx(12e9, rel=1e-12)  # float sum of 24 layers
    assert ps.memory(setup, data, 1).optimizer_state == 0
    assert allreduce.comm_seconds(setup, data, 1) == pytest.approx(cost_model.predict("ring", 8, 2e9, LINK))
    assert ps.comm_seconds(setup, data, 1) == pytest.approx(cost_model.predict("ps", 8, 2e9, LINK))
    # 4 x layers x seq_len x hidden values per example, all-reduced over the 8 shards.
    assert tensor.comm_seconds(setup, L.Degrees(1, 8, 1), 1) == pytest.approx(
        cost_model.predict("ring", 8, 4 * 24 * 1024 * 1864 * 64 * 2, LINK))
    # A pipeline sends one activation and one gradient per micro-batch and stage boundary.
    assert pipeline.comm_seconds(setup, L.Degrees(1, 1, 8), 32) == pytest.approx(
        2 * (32 + 7) * LINK.time(1024 * 1864 * 2 * 2))


def test_hybrid_tries_every_mix_of_two_or_three_kinds_with_tensor_inside_a_machine():
    hybrid = L.LAYOUTS.get("hybrid")
    assert hybrid.degrees(_setup()) == [(4, 1, 2), (2, 1, 4), (4, 2, 1), (2, 2, 2), (1, 2, 4), (2, 4, 1), (1, 4, 2)]
    assert hybrid.degrees(_setup(devices=4, nodes=2)) == [(2, 1, 2), (2, 2, 1), (1, 2, 2)]
    assert hybrid.degrees(_setup(devices=2)) == []


def test_an_impossible_layout_says_why_and_a_hybrid_is_left_out_silently():
    setup = _setup(batch_size=4)
    assert L.LAYOUTS.get("data_allreduce").cost(setup) == "batch 4 does not split over 8 replicas"
    assert L.LAYOUTS.get("pipeline").cost(_setup(devices=32, batch_size=32)) == "32 stages but only 24 layers"
    # Every mix of 4 devices needs 2 replicas of a batch of 1 or 2 stages of 1 layer.
    one_layer = _setup(devices=4, batch_size=1, layers=1)
    assert L.ParallelLayout.cost(L.LAYOUTS.get("hybrid"), one_layer) == "batch 1 does not split over 2 replicas"
    assert L.LAYOUTS.get("hybrid").cost(one_layer) is None


def test_a_registered_layout_is_planned_beside_the_others():
    class FlatRing(L.ParallelLayout):
        name = "flat_ring"

        def degrees(self, setup):
            return [L.Degrees(setup.devices, 1, 1)]

        def comm_seconds(self, setup, degrees, micro):
            return cost_model.predict("ring", degrees.data, setup.gradient_bytes, setup.inter)

    L.LAYOUTS.register("flat_ring", FlatRing(), description="Data parallel, one ring over every device.")
    try:
        result = planner.plan(parameters=1e9, batch_size=64, devices=16, device_memory="80GB", bandwidth="25Gbps",
                              network=planner.Network(nodes=2, intra_bandwidth="300GB/s", latency="0us"))
        flat, two_level = result.row("flat_ring"), result.row("data_allreduce")
    finally:
        L.LAYOUTS.unregister("flat_ring")
    assert [r.strategy for r in result.rows] == ["data_allreduce", "data_ps", "tensor", "pipeline", "hybrid",
                                                 "flat_ring"]
    assert flat.comm_seconds == pytest.approx(cost_model.predict("ring", 16, 2e9, cost_model.Link(0, 1 / 3.125e9)))
    assert flat.memory == two_level.memory and flat.comm_seconds > two_level.comm_seconds
