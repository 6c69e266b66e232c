"""One encoder layer (paper §3.1, Figure 1 left): self-attention, then feed-forward,
each wrapped by :class:`~user_plugin.modules.residual.AddAndNorm`."""

from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor, nn

from .residual import AddAndNorm


class EncoderLayer(nn.Module):
    """``x -> AddNorm(x, SelfAttention(x)) -> AddNorm(., FFN(.))``.

    Args:
        stack: the encoder's options (:class:`~user_plugin.models.transformer_config.StackConfig`).
        blocks: what builds the sub-layers (``build_self_attention(stack)``,
            ``build_feed_forward(stack)``): the model's ``TransformerBlocks``, whose methods
            an extension overrides to swap a block.
    """

    def __init__(self, stack, blocks) -> None:
        super().__init__()
        self.self_attn = blocks.build_self_attention(stack)
        self.self_attn_residual = AddAndNorm(stack.embed_dim, stack.dropout,
                                             stack.normalize_before)
        self.ffn = blocks.build_feed_forward(stack)
        self.ffn_residual = AddAndNorm(stack.embed_dim, stack.dropout, stack.normalize_before)

    def forward(
        self, x: Tensor, attn_mask: Optional[Tensor], need_weights: bool = False
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """x: [B, S, C]; attn_mask: [B, 1, 1, S], True on real tokens (or None)."""
        h = self.self_attn_residual.sublayer_input(x)
        attended, weights = self.self_attn(h, h, attn_mask=attn_mask, need_weights=need_weights)
        x = self.self_attn_residual(x, attended)
        x = self.ffn_residual(x, self.ffn(self.ffn_residual.sublayer_input(x)))
        return x, weights
