"""Scaled dot-product attention (paper §3.2.1) on per-head tensors, and the head reshapes of §3.2.2.

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``

Every attention of the model goes through :func:`attend`: the training forward, the encoder,
and both beam-search caches. By default it calls PyTorch's ``scaled_dot_product_attention``,
which picks a fused kernel where one exists (flash / memory-efficient attention on a GPU); when
a caller needs the attention probabilities (alignments, plots) the formula is written out.

The formula is also written out for bf16 and fp16 training on a CPU (:func:`fused_is_slow`):
there PyTorch's fused CPU kernel has a backward pass about 5x slower than the written-out
products, whose matrix products run on the CPU's bf16 units (measured with torch 2.13 on an
AMX Xeon: 17.8 ms against 3.6 ms for forward and backward of a [64, 4, 32, 64] causal
attention; the demo's bf16 training step went from 0.80 to 0.51 s/update).

Per-head tensors are ``[batch, heads, time, d]``. Masks are boolean and broadcast to
``[batch, heads, queries, keys]``, with ``True`` meaning *may attend*, as SDPA expects.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .dropout import dropout


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``[B, T, h * d] -> [B, h, T, d]``: the h heads' projections side by side (§3.2.2)."""
    batch, time, width = x.shape
    return x.view(batch, time, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``[B, h, T, d] -> [B, T, h * d]``: ``Concat(head_1, ..., head_h)`` (§3.2.2)."""
    batch, heads, time, width = x.shape
    return x.transpose(1, 2).reshape(batch, time, heads * width)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> Tuple[Tensor, Optional[Tensor]]:
    """``softmax(q k^T / sqrt(d_k)) v`` per head; the probabilities too when ``need_weights``.

    Args:
        q, k, v: ``[B, h, T, d_k]``, ``[B, h, S, d_k]``, ``[B, h, S, d_v]``.
        mask: boolean, broadcastable to ``[B, h, T, S]``, True where attending is allowed.
        is_causal: query i sees keys ``j <= i`` (aligned at the end), the decoder's mask (§3.2.3).
        dropout_p: dropout on the probabilities (0 in the paper).
    Returns:
        the context ``[B, h, T, d_v]`` and the probabilities ``[B, h, T, S]`` or None.
    """
    if not need_weights and not fused_is_slow(q):
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
        return context, None
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.size(-2), k.size(-2), q.device), -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    probs = torch.softmax(scores.float(), dim=-1).type_as(scores)
    context = torch.matmul(dropout(probs, dropout_p, dropout_p > 0), v)
    return context, probs if need_weights else None


def fused_is_slow(q: Tensor) -> bool:
    """Whether the written-out formula beats PyTorch's fused kernel: training (gradients on)
    in bf16 or fp16 on a CPU."""
    return (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
            and torch.is_grad_enabled() and q.requires_grad)


def causal_mask(query_len: int, key_len: int, device: torch.device) -> Tensor:
    """``[T, S]`` boolean, True where query i may see key j (``j <= i``, aligned at the end)."""
    offset = key_len - query_len
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(offset)


def key_padding_to_attn_mask(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """``[B, S]`` (True = pad) -> ``[B, 1, 1, S]`` (True = may attend); None stays None."""
    if key_padding_mask is None:
        return None
    return (~key_padding_mask)[:, None, None, :]
