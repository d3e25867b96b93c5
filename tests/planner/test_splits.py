"""The planner's model states weight by weight, as a layout actually splits them."""

from __future__ import annotations

import pytest

from tensorfleet.planner import memory as M
from tensorfleet.planner.splits import WeightSplit, estimate, model_state_bytes, split_fraction


def test_every_weight_split_everywhere_gives_the_megatron_and_zero_figures():
    # 8,000 parameters, each split over t=4 and its states over N=2 replicas: memory.estimate's own picture.
    weights = [WeightSplit(6000, parts=4, zero_parts=2), WeightSplit(2000, parts=4, zero_parts=2)]
    for zero in range(4):
        est = M.estimate_from_counts(stage_parameters=[8000.0], stage_activation_values=[0.0], batch_size=8,
                                     parallelism="hybrid", devices=8, tensor=4, zero=zero)
        assert model_state_bytes(weights, "adam", zero=zero) == {
            "parameters": est.parameters, "gradients": est.gradients, "optimizer_state": est.optimizer_state}


def test_whole_weights_frozen_weights_and_unsplittable_states_count_exactly():
    weights = [WeightSplit(1000, parts=2, zero_parts=4), WeightSplit(100),
               WeightSplit(40, zero_parts=4, trainable=False), WeightSplit(8, parts=2)]
    assert split_fraction(weights) == 1008 / 1148
    assert model_state_bytes(weights, "adam", zero=0) == {
        "parameters": 4 * (500 + 100 + 40 + 4), "gradients": 4 * (500 + 100 + 4),
        "optimizer_state": 8 * (500 + 100 + 4)}
    assert model_state_bytes(weights, "adam", zero=3) == {
        "parameters": 4 * (125 + 100 + 40 + 4), "gradients": 4 * (125 + 100 + 4),
        "optimizer_state": 8 * (125 + 100 + 4)}
    assert model_state_bytes(weights, "sgd", "mixed_float16", zero=2) == {
        "parameters": 2 * (500 + 100 + 40 + 4), "gradients": 2 * (125 + 100 + 4),
        "optimizer_state": 4 * (125 + 100 + 4)}


def test_estimate_keeps_the_activations_and_replaces_the_model_states():
    import tensorfleet as tfl

    model = tfl.models.build("digits_mlp", keras="tf_keras")
    weights = [WeightSplit(int(w.shape.num_elements()), parts=2, zero_parts=2) for w in model.weights]
    est = estimate(model, weights, batch_size=8, optimizer="adam", parallelism="hybrid", devices=4, tensor=2, zero=1)
    plain = M.estimate(model, batch_size=8, optimizer="adam", parallelism="hybrid", devices=4, tensor=2, zero=1)
    assert est == plain  # every weight split: the same as the planner's own picture
    whole = estimate(model, [WeightSplit(model.count_params())], batch_size=8, parallelism="tensor", devices=2)
    assert whole.model_states == 16 * model.count_params()
    assert whole.activations == M.estimate(model, batch_size=8, parallelism="tensor", devices=2).activations


def test_bad_weight_lists_are_clear_errors():
    import tensorfleet as tfl

    model = tfl.models.build("digits_mlp", keras="tf_keras")
    with pytest.raises(ValueError, match=r"^weights must describe the model's 4,810 parameters, one WeightSplit per "
                                         r"weight. Received: weights holding 10 parameters$"):
        estimate(model, [WeightSplit(10)], batch_size=8)
    with pytest.raises(ValueError, match=r"^A list of weight splits describes one stage; use memory.estimate for "
                                         r"pipelines. Received: parallelism='pipeline', pipeline=1$"):
        estimate(model, [WeightSplit(model.count_params())], batch_size=8, parallelism="pipeline", devices=2)
    with pytest.raises(ValueError, match=r"^weights must be a non-empty list of WeightSplit \(one per weight of the "
                                         r"model\). Received: weights=\[\]$"):
        model_state_bytes([])
    with pytest.raises(ValueError, match=r"^parts must be a positive integer. Received: parts=0$"):
        WeightSplit(10, parts=0)
    with pytest.raises(ValueError, match=r"^zero must be an integer from 0 to 3. Received: zero=4$"):
        model_state_bytes([WeightSplit(10)], zero=4)
