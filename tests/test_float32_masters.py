"""Half-precision weights with float32 masters in one flat tensor
(``user_plugin/optimizers/float32_masters.py``), step by step against fairseq's own
``FP16Optimizer`` and against float32 training (``master_weights_equivalence.py``, which the
GPU check runs on CUDA):

* float16: the same overflows, loss scales (growing every window, halved on each overflow) and
  weights to the last bit as fairseq's ``FP16Optimizer`` with fairseq's ``adam`` inside; within
  one float16 rounding with ``vaswani_adam`` or with clipping; the minimum loss scale stops both
  with fairseq's ``FloatingPointError``;
* bfloat16: the same weights as fairseq's non-TPU bf16 path; within the stated tolerances of
  float32 training from the same weights;
* an update's operator calls do not grow with the number of tensors; float16 reads the host
  once per update, bfloat16 never.
"""

from __future__ import annotations

import pytest
import torch

from user_plugin.measurement.operator_count import OperatorCounter
from user_plugin.optimizers import master_weights_equivalence as equivalence
from user_plugin.optimizers.float32_masters import Float32MasterOptimizer


def test_fp16_matches_fairseqs_fp16_optimizer_to_the_last_bit():
    result = equivalence.fp16_against_fairseq(optimizer="adam", steps=30)
    assert result["same_overflows"] and result["overflows"] >= 3
    assert result["same_loss_scales"] and result["loss_scales"] == [128.0, 256.0]
    assert result["max_weight_difference"] == 0.0
    assert result["weights_moved"] > 1e-2
    assert result["max_norm_relative_difference"] < 1e-5  # summed flat or per tensor


@pytest.mark.parametrize("optimizer, max_norm", [("vaswani_adam", 0.0), ("adam", 0.5)])
def test_fp16_with_the_fused_adam_or_clipping_is_within_one_rounding(optimizer, max_norm):
    result = equivalence.fp16_against_fairseq(optimizer=optimizer, steps=30, max_norm=max_norm)
    assert result["same_overflows"] and result["same_loss_scales"]
    # weights are N(0, 1): one float16 unit in the last place is at most 2^-10 * 4
    assert result["max_weight_difference"] <= 4 * 2**-10
    assert result["weights_moved"] > 1e-2


def test_the_minimum_loss_scale_stops_both_alike():
    cfg = dict(init_scale=128.0, min_loss_scale=64.0)
    errors = []
    for build in ("ours", "fairseq"):
        params = equivalence._parameters(equivalence.SHAPES, torch.float16, "cpu", 0)
        config = equivalence.training_config("fp16", flatten=False, **cfg)
        optimizer = Float32MasterOptimizer.build_optimizer(config, params) if build == "ours" \
            else equivalence.optim.FP16Optimizer.build_optimizer(config, params)
        grads = [torch.full(p.shape, 1e6) for p in params]
        with pytest.raises(FloatingPointError, match="Minimum loss scale reached") as caught:
            equivalence._drive(optimizer, params, grads, 1.0, 0.0)
        errors.append(str(caught.value))
        assert optimizer.scaler.loss_scale == 128.0  # fairseq restores the scale it had
    assert errors[0] == errors[1]


@pytest.mark.parametrize("optimizer", ["adam", "vaswani_adam"])
def test_bf16_matches_fairseqs_bf16_path(optimizer):
    result = equivalence.bf16_against_fairseq(optimizer=optimizer, steps=30)
    assert result["overflows"] == 0 and result["loss_scales"] == []
    assert result["max_weight_difference"] == 0.0 and result["weights_moved"] > 1e-2


def test_bf16_masters_follow_float32_training_within_the_stated_tolerances():
    result = equivalence.bf16_against_float32(steps=8)
    assert result["passed"], result
    assert result["model_is_rounded_masters"]
    assert result["loss_relative_difference"] <= equivalence.BF16_TOLERANCES["loss"]
    assert 0 < result["weight_path_relative_difference"] \
        <= equivalence.BF16_TOLERANCES["weight_path"]
    losses = result["losses"]
    assert losses[-1][0] < losses[0][0] and losses[-1][1] < losses[0][1]  # both learn


def update_counts(precision: str, tensors: int) -> dict:
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    shapes = [(16, 8)] * tensors
    params = equivalence._parameters(shapes, dtype, "cpu", 0)
    optimizer = Float32MasterOptimizer.build_optimizer(
        equivalence.training_config(precision, optimizer="vaswani_adam"), params)
    grads = [torch.randn(s) for s in shapes]
    equivalence._drive(optimizer, params, grads, 10.0, 0.0)  # creates the Adam state
    optimizer.zero_grad()
    optimizer.backward(sum((p.float() * g).sum() for p, g in zip(params, grads)))
    with OperatorCounter() as counter:
        optimizer.multiply_grads(0.1)
        optimizer.clip_grad_norm(0.0)
        optimizer.step()
    return {**counter.totals(), "compute_by_name": dict(counter.compute)}


@pytest.mark.parametrize("precision, syncs", [("fp16", 1), ("bf16", 0)])
def test_an_update_costs_the_same_for_10_or_100_tensors_and_syncs_at_most_once(precision,
                                                                               syncs):
    few, many = update_counts(precision, 10), update_counts(precision, 100)
    assert few["compute"] == many["compute"] <= 12, many["compute_by_name"]
    assert few["syncs"] == many["syncs"] == syncs
    assert "aten::_foreach_copy_" in many["compute_by_name"]
