"""Dropout (paper §5.4): while training, each unit is zeroed with probability ``p`` and the rest
are scaled so that every unit keeps its expected value; outside training, the identity.

On a GPU, and inside ``torch.compile`` (``--compile-layers``: inductor generates its own random
numbers), this is ``torch.nn.functional.dropout``. On an eager CPU that function
draws its mask with ``bernoulli_``, one Mersenne-twister draw per unit, serially: 18 % of a
bf16 training step of the demo's model (torch.profiler, torch 2.13). Here a CPU mask is cut
from 64-bit random words instead, four 16-bit lanes per draw, a unit kept when its lane is at
or above ``p`` rounded to a multiple of 2^-16 (0.1 -> 6554 / 65536 = 0.100006); the kept
units are scaled by ``1 / (1 - that p)``, so the expectation is exact. The masks come from
PyTorch's generator, so a seed reproduces them and activation checkpointing (which restores
the generator) recomputes the same ones; they differ from ``F.dropout``'s for the same seed.
A ``p`` within 2^-17 of 0 or 1, which 16 bits cannot resolve, is ``F.dropout``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LANE_BITS = 16
"""Bits of randomness per unit on a CPU: ``p`` is resolved to 2^-16."""


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``x`` with each unit zeroed with probability ``p`` and the rest scaled to keep the
    expectation, when ``training`` and ``p > 0``; ``x`` itself otherwise."""
    if not training or p == 0.0 or x.numel() == 0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling() or not 0.0 < p < 1.0:
        # a GPU's fused kernel; a compiled graph's own random numbers; p = 1 and bad p as F's
        return F.dropout(x, p=p, training=True)
    threshold = round(p * (1 << LANE_BITS))  # lanes below it (of 2^16) are dropped
    if (not 0 < threshold < 1 << LANE_BITS or not x.is_floating_point()
            or x.element_size() not in _SAME_WIDTH_INT):
        return F.dropout(x, p=p, training=True)  # p within 2^-17 of 0 or 1; other dtypes
    scale = torch.tensor((1 << LANE_BITS) / ((1 << LANE_BITS) - threshold), dtype=x.dtype)
    # one factor per unit, 0 or the scale: the backward pass is a single product with it
    return x * keep_factor(random_lanes(x.shape), threshold - (1 << (LANE_BITS - 1)), scale)


_SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def keep_factor(lanes: Tensor, lowest_kept: int, scale: Tensor) -> Tensor:
    """``scale`` where a lane is at least ``lowest_kept``, else 0, in ``scale``'s dtype.

    Built in integer arithmetic: each lane is clamped to 0 or 1 and multiplied by the bit
    pattern of ``scale``, then read as floats. Comparing and selecting through a boolean
    tensor gives the same values in four (float32) to ten (bf16) times the time on a
    CPU (torch 2.13)."""
    keep = lanes.clamp(lowest_kept - 1, lowest_kept).sub_(lowest_kept - 1)
    int_type = _SAME_WIDTH_INT[scale.element_size()]
    return keep.to(int_type).mul_(scale.view(int_type)).view(scale.dtype)


def random_lanes(shape: torch.Size) -> Tensor:
    """Uniform random int16 values of ``shape``, four from each 64-bit draw of PyTorch's
    CPU generator."""
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
    return words.view(torch.int16)[:count].view(shape)
