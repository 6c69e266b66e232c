"""The encoder stack (paper §3.1, Figure 1 left).

``x = Dropout(sqrt(d_model) * Embed(src) + PE)`` (§3.4, §3.5, §5.4), then N encoder layers
(and a final LayerNorm when layers are pre-norm), as :class:`~.stack.TransformerStack`.

The output follows fairseq's encoder-output dictionary (lists of tensors) but is batch-first:
``encoder_out[0]`` is ``[batch, src_len, d_model]``. During beam search it also carries the
:class:`~user_plugin.modules.beam_state.BeamLayout` of its rows (``"beam_layout"``).
"""

from __future__ import annotations

from typing import Dict, List, Optional

from fairseq.models import FairseqEncoder
from torch import Tensor, nn

from ..modules.beam_state import BeamLayout
from ..modules.positional_encoding import check_length, token_positions
from ..modules.scaled_dot_product import key_padding_to_attn_mask
from .blocks import TransformerBlocks
from .stack import TransformerStack
from .transformer_config import StackConfig

EncoderOut = Dict[str, List]


class VaswaniEncoder(TransformerStack, FairseqEncoder):
    """The encoder; ``blocks`` builds its layers (``build_encoder_layer``): the model's
    :class:`~.blocks.TransformerBlocks`, the paper's by default."""

    def __init__(self, cfg, dictionary, embed_tokens: nn.Embedding,
                 blocks: Optional[TransformerBlocks] = None) -> None:
        FairseqEncoder.__init__(self, dictionary)
        self.cfg = cfg
        blocks = blocks or TransformerBlocks()
        self.build_stack(StackConfig.of(cfg, "encoder"), embed_tokens, blocks,
                         blocks.build_encoder_layer)

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        need_attn: bool = False,
    ) -> EncoderOut:
        """Encode ``src_tokens`` [B, S]; ``need_attn`` adds each layer's self-attention."""
        check_length(src_tokens.size(1), self.stack.max_positions, "--max-source-positions")
        padding_mask = src_tokens.eq(self.padding_idx)
        x = self.embed(src_tokens, token_positions(src_tokens, self.padding_idx))
        # always a mask: asking whether the batch has padding would read it on the host
        attn_mask = key_padding_to_attn_mask(padding_mask)
        states: List[Tensor] = []
        attentions: List[Tensor] = []
        for index, layer in enumerate(self.layers):
            if need_attn:
                x, weights = layer(x, attn_mask, need_weights=True)
            else:
                x, weights = self.run_layer(index, layer, x, attn_mask)
            if return_all_hiddens:
                states.append(x)
            if weights is not None:
                attentions.append(weights)
        out: EncoderOut = {
            "encoder_out": [self.final_norm(x)],
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

        Beam search's first reorder expands each sentence into ``beam`` identical rows; it is
        recorded as the output's :class:`BeamLayout`. A later reorder that keeps every
        hypothesis within its own sentence then changes nothing and copies nothing: only
        sentences leaving the batch cost a selection.
        """
        recorded = encoder_out.get("beam_layout")
        if recorded:
            reorder = recorded[0].follow(new_order)
            if reorder.sentences is None:
                return encoder_out
            layout = reorder.after
        else:
            layout = BeamLayout.of_expansion(new_order, _batch_rows(encoder_out))
        reordered: EncoderOut = {
            key: [t.index_select(0, new_order) for t in tensors]
            for key, tensors in encoder_out.items()
            if key != "beam_layout"
        }
        if layout is not None:
            reordered["beam_layout"] = [layout]
        return reordered


def _batch_rows(encoder_out: EncoderOut) -> int:
    for key in ("encoder_out", "encoder_padding_mask"):
        if encoder_out.get(key):
            return encoder_out[key][0].size(0)
    return -1
