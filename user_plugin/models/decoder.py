"""The decoder stack (paper §3.1, Figure 1 right) with incremental decoding.

``y = Dropout(sqrt(d_model) * Embed(prev_output_tokens) + PE)``, N decoder layers (a final
LayerNorm when pre-norm), then the pre-softmax linear, whose weight may be the embedding's (§3.4).

With an ``incremental_state`` (beam search), only the newest target position is computed; each
attention module keeps its keys and values in that state (see ``MultiHeadAttention``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor, nn

from ..modules.attention import IncrementalState, causal_mask, key_padding_to_attn_mask
from ..modules.beam_groups import identical_row_groups
from ..modules.decoder_layer import DecoderLayer
from ..modules.positional_encoding import build_positional_encoding, check_length, token_positions


class VaswaniDecoder(FairseqIncrementalDecoder):
    def __init__(self, cfg, dictionary, embed_tokens: nn.Embedding) -> None:
        super().__init__(dictionary)
        self.cfg = cfg
        dim = cfg.decoder_embed_dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(dim)
        self.embed_positions = build_positional_encoding(
            dim, cfg.max_target_positions, cfg.decoder_learned_pos
        )
        self.dropout = cfg.dropout
        self.layers = nn.ModuleList([self.build_layer(cfg) for _ in range(cfg.decoder_layers)])
        self.layer_norm = nn.LayerNorm(dim) if cfg.decoder_normalize_before else None
        self.output_projection = nn.Linear(dim, len(dictionary), bias=False)
        if cfg.share_all_embeddings or cfg.share_decoder_input_output_embed:
            self.output_projection.weight = self.embed_tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=dim**-0.5)

    def build_layer(self, cfg) -> nn.Module:
        """One decoder layer; override to use a layer of your own."""
        return DecoderLayer(cfg)

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        need_attn: bool = False,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Scores for the next token at every position of ``prev_output_tokens`` [B, T].

        Returns ``(logits [B, T, V], extra)``; ``extra["attn"][0]`` is the last layer's
        encoder-decoder attention averaged over heads, only when ``need_attn`` is set.
        """
        x, extra = self.extract_features(
            prev_output_tokens, encoder_out, incremental_state, return_all_hiddens, need_attn
        )
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[IncrementalState] = None,
        return_all_hiddens: bool = False,
        need_attn: bool = False,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        check_length(
            prev_output_tokens.size(1), self.cfg.max_target_positions, "--max-target-positions"
        )
        positions = token_positions(prev_output_tokens, self.padding_idx)
        tokens = prev_output_tokens
        if incremental_state is not None:
            tokens, positions = tokens[:, -1:], positions[:, -1:]

        x = self.embed_scale * self.embed_tokens(tokens)
        x = x + self.embed_positions(positions).to(x)
        x = F.dropout(x, p=self.dropout, training=self.training)

        self_attn_mask = None
        if incremental_state is None:
            self_attn_mask = self._self_attention_mask(tokens)
        enc, enc_mask = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
            padding = encoder_out["encoder_padding_mask"]
            if len(padding) > 0 and padding[0].any():
                enc_mask = key_padding_to_attn_mask(padding[0])

        beam_group = None
        if incremental_state is not None:
            beam_group = self._beam_group(incremental_state, encoder_out, enc, enc_mask)
        states: List[Tensor] = [x]
        attentions: List[Dict[str, Optional[Tensor]]] = []
        for layer in self.layers:
            x, weights = layer(
                x,
                enc,
                enc_mask,
                self_attn_mask=self_attn_mask,
                incremental_state=incremental_state,
                need_weights=need_attn,
                beam_group=beam_group,
            )
            states.append(x)
            attentions.append(weights)
        if self.layer_norm is not None:
            x = self.layer_norm(x)

        attn: Optional[Tensor] = None
        if need_attn:
            attn = attentions[-1]["encoder_attn"].mean(dim=1)
        extra: Dict[str, Any] = {
            "attn": [attn],
            "inner_states": states if return_all_hiddens else [x],
        }
        if need_attn:
            extra["layer_attn"] = attentions
        return x, extra

    def _beam_group(
        self,
        incremental_state: IncrementalState,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        enc: Optional[Tensor],
        enc_mask: Optional[Tensor],
    ) -> int:
        """Hypotheses per sentence (consecutive rows with the same encoder output), found on
        the first decoding step and kept: from the encoder's beam expansion when it recorded
        one (``beam_group``), else by comparing encoder rows; 1 without an encoder."""
        state = self.get_incremental_state(incremental_state, "beam")
        if state:
            return state["group"]
        group = 1
        if encoder_out is not None and encoder_out.get("beam_group"):
            group = int(encoder_out["beam_group"][0])
        elif enc is not None:
            group = identical_row_groups(enc, enc_mask)
        self.set_incremental_state(incremental_state, "beam", {"group": group})
        return group

    def _self_attention_mask(self, tokens: Tensor) -> Optional[Tensor]:
        """None (plain causal mask) unless a pad is followed by a real token in some row.

        Right padding needs no mask beyond the causal one: real positions never see a later
        pad. Padding elsewhere gets an explicit mask hiding pads, where each position still
        sees itself so that no row of the softmax is empty.
        """
        padding = tokens.eq(self.padding_idx)
        if not (padding[:, :-1] & ~padding[:, 1:]).any():
            return None
        length = tokens.size(1)
        allowed = causal_mask(length, length, tokens.device)[None, :, :] & ~padding[:, None, :]
        allowed = allowed | torch.eye(length, dtype=torch.bool, device=tokens.device)
        return allowed[:, None, :, :]

    def output_layer(self, features: Tensor) -> Tensor:
        """The pre-softmax linear transformation (§3.4)."""
        return self.output_projection(features)

    def max_positions(self) -> int:
        return self.cfg.max_target_positions
