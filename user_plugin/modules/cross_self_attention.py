"""Cross+self-attention of the decoder (Peitz et al. 2019, fairseq's ``--cross-self-attention``).

The paper's decoder layer attends to its own prefix (masked self-attention) and then to the
encoder output (encoder-decoder attention, §3.2.3). Cross+self-attention lets the decoder's
self-attention see both at once: the keys and values of position i are the encoder output
followed by the decoder states up to i, projected by the same ``W^K`` and ``W^V`` (§3.2.2),
under one softmax::

    CrossSelf(y)_i = Attention(y_i W^Q, [enc; y_<=i] W^K, [enc; y_<=i] W^V)

Padded source positions are hidden, as in encoder-decoder attention. When decoding step by step
the encoder part of the keys is projected once per sentence and the prefix part is cached like
self-attention's (:class:`~.beam_cache.CrossSelfAttentionCache`).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import IncrementalState, MultiHeadAttention
from .beam_cache import CrossSelfAttentionCache
from .beam_state import BeamState
from .scaled_dot_product import causal_mask, split_heads


class CrossSelfAttention(MultiHeadAttention):
    """Multi-head attention of decoder states over ``[encoder output; decoder prefix]``.

    Built like :class:`~.attention.MultiHeadAttention` (the encoder output and the decoder
    states must have the same width), called with the encoder output besides the queries.
    """

    def forward(  # type: ignore[override]
        self,
        query: Tensor,
        encoder_out: Optional[Tensor],
        encoder_mask: Optional[Tensor] = None,
        self_attn_mask: Optional[Tensor] = None,
        is_causal: bool = True,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = False,
        beam: Optional[BeamState] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` [B, T, C] to ``[encoder_out; query]`` [B, S + T, C].

        Args:
            encoder_out: [B, S, C] (may be None after the first step of step-by-step decoding).
            encoder_mask: [B, 1, 1, S], True on real source tokens, or None.
            self_attn_mask: [B, 1, T, T], True where a target position may see another (the
                decoder's mask for padded targets); None means the causal mask (§3.2.3), or
                every target position when ``is_causal`` is False.
            incremental_state, beam: decode one query step per call (beam search).
            need_weights: also return the probabilities, source positions first.
        """
        if self._step_by_step(incremental_state, beam):
            return self._attend_step(query, encoder_out, encoder_mask, incremental_state, beam,
                                     need_weights)
        if encoder_out is None:
            raise ValueError("cross+self-attention needs the encoder output")
        keys = torch.cat([encoder_out, query], dim=1)
        mask = _joint_mask(encoder_mask, self_attn_mask, is_causal, query, encoder_out.size(1))
        return self._attend_whole(query, keys, mask, False, need_weights)

    def _attend_step(
        self,
        query: Tensor,
        encoder_out: Optional[Tensor],
        encoder_mask: Optional[Tensor],
        incremental_state: IncrementalState,
        beam: BeamState,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The newest step against its sentence's source (projected on the first step, once
        per sentence) and its own prefix, itself included."""
        cache = self._cache(incremental_state)
        if cache is None:
            if encoder_out is None:
                raise ValueError("the encoder output is needed on the first decoding step")
            group = beam.layout.group
            sentences = encoder_out[::group]
            cache = CrossSelfAttentionCache(
                beam,
                split_heads(self.k_proj(sentences), self.num_heads),
                split_heads(self.v_proj(sentences), self.num_heads),
                None if encoder_mask is None else encoder_mask[::group],
                self.num_heads, self.key_dim, self.value_dim,
            )
            self._set_cache(incremental_state, cache)
        cache.append(self.k_proj(query), self.v_proj(query))
        context, weights = cache.attend(self.q_proj(query), need_weights, self._dropout_p())
        return self.out_proj(context), weights


def _joint_mask(encoder_mask: Optional[Tensor], self_attn_mask: Optional[Tensor],
                is_causal: bool, query: Tensor, source_len: int) -> Tensor:
    """``[B, 1, T, S + T]``: every real source token, then the target positions each query may
    see (causal, or the decoder's own mask for padded targets)."""
    batch, length = query.size(0), query.size(1)
    if encoder_mask is None:
        to_source = query.new_ones((batch, 1, length, source_len), dtype=torch.bool)
    else:
        to_source = encoder_mask.expand(batch, 1, length, source_len)
    if self_attn_mask is None:
        self_attn_mask = (causal_mask(length, length, query.device) if is_causal
                          else query.new_ones((length, length), dtype=torch.bool))[None, None]
    to_target = self_attn_mask.expand(batch, 1, length, length)
    return torch.cat([to_source, to_target], dim=-1)
