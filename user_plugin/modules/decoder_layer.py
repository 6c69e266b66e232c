"""One decoder layer (paper §3.1, Figure 1 right): masked self-attention, encoder-decoder
attention, feed-forward, each wrapped by :class:`~user_plugin.modules.residual.AddAndNorm`."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from torch import Tensor, nn

from .attention import IncrementalState, MultiHeadAttention
from .feed_forward import PositionWiseFeedForward
from .residual import AddAndNorm


class DecoderLayer(nn.Module):
    """``y -> AddNorm(y, MaskedSelfAttn(y)) -> AddNorm(., EncDecAttn(., enc)) -> AddNorm(., FFN)``.

    Queries of the encoder-decoder attention come from the decoder, keys and values from the
    encoder output (§3.2.3). Sub-layers come from overridable factory methods.
    """

    def __init__(self, cfg) -> None:
        super().__init__()
        dim = cfg.decoder_embed_dim
        pre_norm = cfg.decoder_normalize_before
        self.self_attn = self.build_self_attention(cfg)
        self.self_attn_residual = AddAndNorm(dim, cfg.dropout, pre_norm)
        self.encoder_attn = self.build_encoder_attention(cfg)
        self.encoder_attn_residual = AddAndNorm(dim, cfg.dropout, pre_norm)
        self.ffn = self.build_feed_forward(cfg)
        self.ffn_residual = AddAndNorm(dim, cfg.dropout, pre_norm)

    def build_self_attention(self, cfg) -> nn.Module:
        return MultiHeadAttention(
            cfg.decoder_embed_dim,
            cfg.decoder_attention_heads,
            key_dim=cfg.attention_key_dim,
            value_dim=cfg.attention_value_dim,
            dropout=cfg.attention_dropout,
        )

    def build_encoder_attention(self, cfg) -> nn.Module:
        return MultiHeadAttention(
            cfg.decoder_embed_dim,
            cfg.decoder_attention_heads,
            key_dim=cfg.attention_key_dim,
            value_dim=cfg.attention_value_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder=True,
        )

    def build_feed_forward(self, cfg) -> nn.Module:
        return PositionWiseFeedForward(
            cfg.decoder_embed_dim,
            cfg.decoder_ffn_embed_dim,
            activation_fn=str(cfg.activation_fn),
            activation_dropout=cfg.activation_dropout,
        )

    def forward(
        self,
        y: Tensor,
        encoder_out: Optional[Tensor],
        encoder_mask: Optional[Tensor],
        self_attn_mask: Optional[Tensor] = None,
        causal: bool = True,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = False,
        beam_group: Optional[int] = None,
    ) -> Tuple[Tensor, Dict[str, Optional[Tensor]]]:
        """y: [B, T, C]; encoder_out: [B, S, C]; encoder_mask: [B, 1, 1, S] (True = real token).

        ``self_attn_mask`` replaces the plain causal mask when the target batch has padding
        that is not at the end. ``beam_group`` (incremental decoding): hypotheses per
        sentence in consecutive rows, passed to both attentions' caches. Returns the output
        and, if asked, the attention probabilities.
        """
        h = self.self_attn_residual.sublayer_input(y)
        attended, self_weights = self.self_attn(
            h,
            h,
            attn_mask=self_attn_mask,
            is_causal=causal and self_attn_mask is None,
            incremental_state=incremental_state,
            need_weights=need_weights,
            beam_group=beam_group,
        )
        y = self.self_attn_residual(y, attended)

        h = self.encoder_attn_residual.sublayer_input(y)
        attended, cross_weights = self.encoder_attn(
            h,
            encoder_out,
            attn_mask=encoder_mask,
            incremental_state=incremental_state,
            need_weights=need_weights,
            beam_group=beam_group,
        )
        y = self.encoder_attn_residual(y, attended)

        y = self.ffn_residual(y, self.ffn(self.ffn_residual.sublayer_input(y)))
        return y, {"self_attn": self_weights, "encoder_attn": cross_weights}
