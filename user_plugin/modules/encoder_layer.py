"""One encoder layer (paper §3.1, Figure 1 left): self-attention, then feed-forward,
each wrapped by :class:`~user_plugin.modules.residual.AddAndNorm`."""

from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .feed_forward import PositionWiseFeedForward
from .residual import AddAndNorm


class EncoderLayer(nn.Module):
    """``x -> AddNorm(x, SelfAttention(x)) -> AddNorm(., FFN(.))``.

    The sub-layers are built by the overridable factory methods :meth:`build_self_attention`
    and :meth:`build_feed_forward`, so an extension can swap one block and keep the rest.
    """

    def __init__(self, cfg) -> None:
        super().__init__()
        dim = cfg.encoder_embed_dim
        self.self_attn = self.build_self_attention(cfg)
        self.self_attn_residual = AddAndNorm(dim, cfg.dropout, cfg.encoder_normalize_before)
        self.ffn = self.build_feed_forward(cfg)
        self.ffn_residual = AddAndNorm(dim, cfg.dropout, cfg.encoder_normalize_before)

    def build_self_attention(self, cfg) -> nn.Module:
        return MultiHeadAttention(
            cfg.encoder_embed_dim,
            cfg.encoder_attention_heads,
            key_dim=cfg.attention_key_dim,
            value_dim=cfg.attention_value_dim,
            dropout=cfg.attention_dropout,
        )

    def build_feed_forward(self, cfg) -> nn.Module:
        return PositionWiseFeedForward(
            cfg.encoder_embed_dim,
            cfg.encoder_ffn_embed_dim,
            activation_fn=str(cfg.activation_fn),
            activation_dropout=cfg.activation_dropout,
        )

    def forward(
        self, x: Tensor, attn_mask: Optional[Tensor], need_weights: bool = False
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """x: [B, S, C]; attn_mask: [B, 1, 1, S], True on real tokens (or None)."""
        h = self.self_attn_residual.sublayer_input(x)
        attended, weights = self.self_attn(h, h, attn_mask=attn_mask, need_weights=need_weights)
        x = self.self_attn_residual(x, attended)
        x = self.ffn_residual(x, self.ffn(self.ffn_residual.sublayer_input(x)))
        return x, weights
