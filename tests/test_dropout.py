"""Dropout's CPU mask (user_plugin/modules/dropout.py) keeps the law of §5.4's dropout: each
unit dropped with probability p, independently, the kept ones scaled so that the expectation is
the input's; the identity outside training; reproducible from the seed.

Measured, not asserted from the code: the kept fraction and the neighbours' joint drops over
two million units are within five standard deviations of the law's; the gradient is the mask
times the scale.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from user_plugin.modules.dropout import dropout, keep_factor

UNITS = 2_000_000


def within_five_sigma(observed: float, probability: float, trials: int) -> bool:
    return abs(observed - probability) <= 5 * math.sqrt(probability * (1 - probability) / trials)


@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_units_drop_independently_with_probability_p_and_keep_the_expectation(p, dtype):
    torch.manual_seed(0)
    out = dropout(torch.ones(UNITS, dtype=dtype), p, training=True)
    assert out.dtype == dtype and out.shape == (UNITS,)
    dropped = out == 0
    assert within_five_sigma(dropped.float().mean().item(), p, UNITS)
    # adjacent units (often lanes of one random word) drop together as often as independence says
    both = (dropped[0::2] & dropped[1::2]).float().mean().item()
    assert within_five_sigma(both, p * p, UNITS // 2)
    kept_values = out[~dropped].float().unique()
    assert kept_values.numel() == 1
    # the scale is 1 / (1 - p) for p as resolved, rounded to the dtype (as F.dropout's is), so
    # the expectation is the input's up to that rounding
    keep_probability = 1 - round(p * 65536) / 65536
    scale = torch.tensor(1 / keep_probability, dtype=dtype).float().item()
    assert kept_values.item() == scale
    expected_mean = keep_probability * scale
    assert abs(expected_mean - 1.0) <= (1e-6 if dtype == torch.float32 else 2**-8)
    assert abs(out.float().mean().item() - expected_mean) <= 5 * scale * math.sqrt(
        keep_probability * (1 - keep_probability) / UNITS)


def test_same_seed_same_mask_other_seed_other_mask_any_shape():
    x = torch.randn(3, 7, 5)  # 105 units: not a multiple of the four lanes of a random word
    torch.manual_seed(4)
    a = dropout(x, 0.5, training=True)
    torch.manual_seed(4)
    b = dropout(x, 0.5, training=True)
    torch.manual_seed(5)
    c = dropout(x, 0.5, training=True)
    assert torch.equal(a, b) and not torch.equal(a, c)
    kept = a != 0
    assert torch.allclose(a[kept], x[kept] * 2.0)
    # a non-contiguous input is masked unit by unit as well
    t = dropout(x.transpose(0, 2), 0.5, training=True)
    assert t.shape == (5, 7, 3) and torch.allclose(t[t != 0], 2.0 * x.transpose(0, 2)[t != 0])


def test_gradient_is_the_mask_times_the_scale():
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(1)
    out = dropout(x, 0.25, training=True)
    out.backward(torch.ones_like(out))
    kept = out.detach() != 0
    scale = 65536 / (65536 - round(0.25 * 65536))
    assert torch.equal(x.grad, kept.float() * scale)


def test_identity_outside_training_or_at_p_zero_and_F_dropout_at_the_ends():
    x = torch.randn(10, 4)
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))
    with pytest.raises(ValueError, match="probability"):
        dropout(x, 1.5, training=True)
    assert torch.equal(F.dropout(x, 0.1, training=False), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("lowest_kept", [-32767, -26214, 0, 32767])
def test_the_integer_built_factor_is_the_scale_where_a_lane_is_kept_for_every_lane(
        dtype, lowest_kept):
    lanes = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)  # every lane value
    scale = torch.tensor(1.111, dtype=dtype)
    factor = keep_factor(lanes, lowest_kept, scale)
    assert factor.dtype == dtype
    assert torch.equal(factor, torch.where(lanes >= lowest_kept, scale, 0.0))


def test_a_p_that_sixteen_bits_cannot_resolve_is_F_dropouts():
    x = torch.randn(40, 50)
    for p in (1e-6, 1 - 1e-6):
        torch.manual_seed(2)
        ours = dropout(x, p, training=True)
        torch.manual_seed(2)
        assert torch.equal(ours, F.dropout(x, p, training=True))
