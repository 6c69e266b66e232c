"""One decoder layer (paper §3.1, Figure 1 right): masked self-attention, encoder-decoder
attention, feed-forward, each wrapped by :class:`~user_plugin.modules.residual.AddAndNorm`.

Two options of fairseq's transformer change the layer: ``--no-cross-attention`` leaves out the
encoder-decoder attention, and ``--cross-self-attention`` makes the self-attention see the
encoder output too (:mod:`~user_plugin.modules.cross_self_attention`)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from torch import Tensor, nn

from .attention import IncrementalState
from .beam_state import BeamState
from .residual import AddAndNorm


class DecoderLayer(nn.Module):
    """``y -> AddNorm(y, MaskedSelfAttn(y)) -> AddNorm(., EncDecAttn(., enc)) -> AddNorm(., FFN)``.

    Queries of the encoder-decoder attention come from the decoder, keys and values from the
    encoder output (§3.2.3).

    Args:
        stack: the decoder's options (:class:`~user_plugin.models.transformer_config.StackConfig`).
        blocks: what builds the sub-layers (``build_self_attention``, ``build_encoder_attention``,
            ``build_feed_forward``, ``build_cross_self_attention``, each taking ``stack``): the
            model's ``TransformerBlocks``.
    """

    def __init__(self, stack, blocks) -> None:
        super().__init__()
        dim, dropout, pre_norm = stack.embed_dim, stack.dropout, stack.normalize_before
        self.cross_self_attention = stack.cross_self_attention
        self.self_attn = (blocks.build_cross_self_attention(stack) if self.cross_self_attention
                          else blocks.build_self_attention(stack))
        self.self_attn_residual = AddAndNorm(dim, dropout, pre_norm)
        self.encoder_attn: Optional[nn.Module] = None
        self.encoder_attn_residual: Optional[AddAndNorm] = None
        if stack.cross_attention:
            self.encoder_attn = blocks.build_encoder_attention(stack)
            self.encoder_attn_residual = AddAndNorm(dim, dropout, pre_norm)
        self.ffn = blocks.build_feed_forward(stack)
        self.ffn_residual = AddAndNorm(dim, dropout, pre_norm)

    def forward(
        self,
        y: Tensor,
        encoder_out: Optional[Tensor],
        encoder_mask: Optional[Tensor],
        self_attn_mask: Optional[Tensor] = None,
        causal: bool = True,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = False,
        beam: Optional[BeamState] = None,
    ) -> Tuple[Tensor, Dict[str, Optional[Tensor]]]:
        """y: [B, T, C]; encoder_out: [B, S, C]; encoder_mask: [B, 1, 1, S] (True = real token).

        ``self_attn_mask`` replaces the plain causal mask when the target batch has padding
        that is not at the end. ``incremental_state`` and ``beam``: decoding step by step.
        Returns the output and, if asked, both attentions' probabilities (the encoder-decoder
        one None without that sub-layer).
        """
        h = self.self_attn_residual.sublayer_input(y)
        if self.cross_self_attention:
            attended, self_weights = self.self_attn(
                h,
                encoder_out,
                encoder_mask,
                self_attn_mask=self_attn_mask,
                is_causal=causal,
                incremental_state=incremental_state,
                need_weights=need_weights,
                beam=beam,
            )
        else:
            attended, self_weights = self.self_attn(
                h,
                h,
                attn_mask=self_attn_mask,
                is_causal=causal and self_attn_mask is None,
                incremental_state=incremental_state,
                need_weights=need_weights,
                beam=beam,
            )
        y = self.self_attn_residual(y, attended)

        cross_weights = None
        if self.encoder_attn is not None and self.encoder_attn_residual is not None:
            h = self.encoder_attn_residual.sublayer_input(y)
            attended, cross_weights = self.encoder_attn(
                h,
                encoder_out,
                attn_mask=encoder_mask,
                incremental_state=incremental_state,
                need_weights=need_weights,
                beam=beam,
            )
            y = self.encoder_attn_residual(y, attended)

        y = self.ffn_residual(y, self.ffn(self.ffn_residual.sublayer_input(y)))
        return y, {"self_attn": self_weights, "encoder_attn": cross_weights}
