"""The encoder stack (paper §3.1, Figure 1 left).

``x = Dropout(sqrt(d_model) * Embed(src) + PE)`` (§3.4, §3.5, §5.4), then N encoder layers
(and a final LayerNorm when layers are pre-norm).

The output follows fairseq's encoder-output dictionary (lists of tensors) but is batch-first:
``encoder_out[0]`` is ``[batch, src_len, d_model]``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqEncoder
from torch import Tensor, nn

from ..modules.attention import key_padding_to_attn_mask
from ..modules.beam_groups import expansion_group, is_identity, sentences_of_reorder
from ..modules.encoder_layer import EncoderLayer
from ..modules.positional_encoding import build_positional_encoding, check_length, token_positions

EncoderOut = Dict[str, List[Tensor]]


class VaswaniEncoder(FairseqEncoder):
    def __init__(self, cfg, dictionary, embed_tokens: nn.Embedding) -> None:
        super().__init__(dictionary)
        self.cfg = cfg
        dim = cfg.encoder_embed_dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(dim)
        self.embed_positions = build_positional_encoding(
            dim, cfg.max_source_positions, cfg.encoder_learned_pos
        )
        self.dropout = cfg.dropout
        self.layers = nn.ModuleList([self.build_layer(cfg) for _ in range(cfg.encoder_layers)])
        self.layer_norm = nn.LayerNorm(dim) if cfg.encoder_normalize_before else None

    def build_layer(self, cfg) -> nn.Module:
        """One encoder layer; override to use a layer of your own."""
        return EncoderLayer(cfg)

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        need_attn: bool = False,
    ) -> EncoderOut:
        """Encode ``src_tokens`` [B, S]; ``need_attn`` adds each layer's self-attention."""
        check_length(src_tokens.size(1), self.cfg.max_source_positions, "--max-source-positions")
        padding_mask = src_tokens.eq(self.padding_idx)
        x = self.embed_scale * self.embed_tokens(src_tokens)
        x = x + self.embed_positions(token_positions(src_tokens, self.padding_idx)).to(x)
        x = F.dropout(x, p=self.dropout, training=self.training)

        attn_mask = key_padding_to_attn_mask(padding_mask) if padding_mask.any() else None
        states: List[Tensor] = []
        attentions: List[Tensor] = []
        for layer in self.layers:
            x, weights = layer(x, attn_mask, need_weights=need_attn)
            if return_all_hiddens:
                states.append(x)
            if weights is not None:
                attentions.append(weights)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        out: EncoderOut = {
            "encoder_out": [x],
            "encoder_padding_mask": [padding_mask],
            "encoder_states": states,
            "src_tokens": [],
            "src_lengths": [] if src_lengths is None else [src_lengths],
        }
        if need_attn:
            out["self_attn"] = attentions
        return out

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        """Select batch rows ``new_order`` of every batch-first tensor (beam search).

        Beam search first expands each sentence into ``beam`` consecutive copies; that expansion
        is recorded (``encoder_out["beam_group"]``). Later reorders that keep every hypothesis
        among the copies of its own sentence then change nothing and copy nothing; only
        sentences leaving the batch cost a selection.
        """
        rows = _batch_rows(encoder_out)
        group = int(encoder_out["beam_group"][0]) if encoder_out.get("beam_group") else 0
        sentences = sentences_of_reorder(new_order, group) if group else None
        if sentences is None:
            group = expansion_group(new_order, rows)
        elif is_identity(sentences, rows // group):
            return encoder_out
        reordered = {
            key: [t.index_select(0, new_order) for t in tensors]
            for key, tensors in encoder_out.items()
            if key != "beam_group"
        }
        if group > 1:
            reordered["beam_group"] = [torch.tensor(group)]
        return reordered

    def max_positions(self) -> int:
        return self.cfg.max_source_positions


def _batch_rows(encoder_out: EncoderOut) -> int:
    for key in ("encoder_out", "encoder_padding_mask"):
        if encoder_out.get(key):
            return encoder_out[key][0].size(0)
    return -1

