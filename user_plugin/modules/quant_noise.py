"""Quantization noise on a linear layer's weight (Fan, Stock et al. 2020, "Training with
Quantization Noise for Extreme Model Compression"; fairseq's ``--quant-noise-pq``).

While training, every forward pass sees the weight with a random fraction ``p`` of its blocks
(``block_size`` consecutive input weights of one output unit, the blocks iterative product
quantization later replaces by codewords) dropped, and the rest scaled by ``1 / (1 - p)``;
gradients reach every weight unchanged (straight-through). In evaluation the layer is untouched.

The parameters themselves are never modified (fairseq's ``quant_noise`` hook writes the noisy
weight back into the parameter at every training forward, so dropped blocks stay dropped and
the others keep growing by ``1 / (1 - p)``). The mask is drawn from torch's generator, so
activation checkpointing, which replays that generator, recomputes the same noise.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def add_quant_noise(linear: nn.Linear, p: float, block_size: int) -> nn.Linear:
    """Make ``linear`` see quantization noise of rate ``p`` on blocks of ``block_size`` input
    weights while training (its ``in_features`` must be a multiple of ``block_size``)."""
    if p <= 0:
        return linear
    if linear.in_features % block_size:
        raise ValueError(
            f"quantization noise blocks of {block_size} do not divide the "
            f"{linear.in_features} input features of {linear}"
        )
    linear.forward = functools.partial(_noisy_linear, linear, p, block_size)  # type: ignore
    linear.quant_noise = (p, block_size)  # type: ignore[assignment]
    return linear


def _noisy_linear(linear: nn.Linear, p: float, block_size: int, x: Tensor) -> Tensor:
    weight = linear.weight
    if linear.training:
        out_features, in_features = weight.shape
        blocks = torch.rand(out_features, in_features // block_size, device=weight.device) < p
        dropped = blocks.repeat_interleave(block_size, dim=1)
        noisy = weight.masked_fill(dropped, 0.0) / (1.0 - p)
        weight = weight + (noisy - weight).detach()  # forward: noisy; backward: identity
    return F.linear(x, weight, linear.bias)
