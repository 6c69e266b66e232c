"""Multi-head attention (paper §3.2.2) over scaled dot-product attention (§3.2.1).

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with
``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.

The ``h`` per-head projections are stored as one matrix each (``q_proj``, ``k_proj``, ``v_proj``),
so all heads are computed by one matrix product. ``d_k`` and ``d_v`` default to ``d_model / h``
and may be set on their own (Table 3 row B).

One path per case, each the formula above:

* the whole sequence at once (training, the encoder, scoring): project, attend, concatenate;
* decoder self-attention, one step at a time (beam search): the step's key and value join the
  :class:`~.beam_cache.SelfAttentionCache`, and the step's query attends to its own prefix;
* encoder-decoder attention, one step at a time: keys and values are projected from the encoder
  output once per sentence (:class:`~.beam_cache.EncoderAttentionCache`).

Tensors are batch-first: ``[batch, time, channels]``. Masks are boolean with ``True`` meaning
*may attend*.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from .beam_cache import EncoderAttentionCache, SelfAttentionCache
from .beam_state import BeamReorder, BeamState
from .scaled_dot_product import attend, merge_heads, split_heads

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
Cache = Union[SelfAttentionCache, EncoderAttentionCache]


@with_incremental_state
class MultiHeadAttention(nn.Module):
    """Multi-head attention with the caches of step-by-step decoding.

    Args:
        embed_dim: d_model, the width of queries and of the output.
        num_heads: h.
        key_dim: d_k per head (default d_model / h).
        value_dim: d_v per head (default d_model / h).
        dropout: dropout on the attention probabilities (0 in the paper).
        encoder_decoder: the decoder's encoder-decoder attention (§3.2.3): keys and values come
            from the encoder output, so they are computed once per sentence when decoding.
        kv_dim: width of the inputs of keys and values (default ``embed_dim``; the encoder's
            d_model for encoder-decoder attention).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        key_dim: Optional[int] = None,
        value_dim: Optional[int] = None,
        dropout: float = 0.0,
        encoder_decoder: bool = False,
        kv_dim: Optional[int] = None,
    ) -> None:
        super().__init__()
        if (key_dim is None or value_dim is None) and embed_dim % num_heads != 0:
            raise ValueError(
                f"embed dim {embed_dim} is not divisible by {num_heads} attention heads; "
                "choose another --*-attention-heads or set --attention-key-dim and "
                "--attention-value-dim"
            )
        kv_dim = kv_dim or embed_dim
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.key_dim = key_dim or embed_dim // num_heads
        self.value_dim = value_dim or embed_dim // num_heads
        self.dropout = dropout
        self.encoder_decoder = encoder_decoder
        self.q_proj = nn.Linear(embed_dim, num_heads * self.key_dim)
        self.k_proj = nn.Linear(kv_dim, num_heads * self.key_dim)
        self.v_proj = nn.Linear(kv_dim, num_heads * self.value_dim)
        self.out_proj = nn.Linear(num_heads * self.value_dim, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper gives no initialisation. Ours is fairseq's: Xavier-uniform projections,
        scaled by 1/sqrt(2) for queries, keys and values when they read d_model-wide inputs,
        PyTorch's default biases for them, and a zero output bias. On the Multi30k demo it
        trains markedly faster than Xavier with zero biases everywhere (validation perplexity
        at update 300: 63 against 87; docs/training_curves.md)."""
        gain = 2**-0.5 if self.k_proj.in_features == self.embed_dim else 1.0
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: Tensor,
        key_value: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        is_causal: bool = False,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = False,
        beam: Optional[BeamState] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` [B, T, C] to ``key_value`` [B, S, C].

        Args:
            attn_mask: boolean, broadcastable to [B, h, T, S], True where attending is allowed.
            is_causal: position i attends to positions <= i (decoder self-attention, §3.2.3).
            incremental_state: decode one query step per call, keeping keys and values in it
                (``key_value`` may be None after the first step of encoder-decoder attention).
            need_weights: also return the attention probabilities ([B, h, T, S]).
            beam: with ``incremental_state``, the decoder's :class:`BeamState`.
        """
        if not self._step_by_step(incremental_state, beam):
            return self._attend_whole(query, key_value, attn_mask, is_causal, need_weights)
        if self.encoder_decoder:
            return self._attend_step_to_encoder(query, key_value, attn_mask, incremental_state,
                                                beam, need_weights)
        return self._attend_step_to_prefix(query, incremental_state, beam, need_weights)

    def _attend_whole(
        self,
        query: Tensor,
        key_value: Optional[Tensor],
        attn_mask: Optional[Tensor],
        is_causal: bool,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Every query position at once: ``Concat(head_1..head_h) W^O``."""
        if key_value is None:
            raise ValueError("keys and values are needed")
        q = split_heads(self.q_proj(query), self.num_heads)
        k = split_heads(self.k_proj(key_value), self.num_heads)
        v = split_heads(self.v_proj(key_value), self.num_heads)
        context, weights = attend(q, k, v, attn_mask, is_causal, self._dropout_p(), need_weights)
        return self.out_proj(merge_heads(context)), weights

    def _attend_step_to_prefix(
        self,
        query: Tensor,
        incremental_state: IncrementalState,
        beam: BeamState,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Self-attention of the newest step to the hypothesis' prefix, itself included (the
        causal mask of §3.2.3 is implicit: the cache holds no later step)."""
        cache = self._cache(incremental_state)
        if cache is None:
            cache = SelfAttentionCache(beam, self.num_heads, self.key_dim, self.value_dim)
            self._set_cache(incremental_state, cache)
        cache.append(self.k_proj(query), self.v_proj(query))
        context, weights = cache.attend(self.q_proj(query), need_weights, self._dropout_p())
        return self.out_proj(context), weights

    def _attend_step_to_encoder(
        self,
        query: Tensor,
        encoder_out: Optional[Tensor],
        encoder_mask: Optional[Tensor],
        incremental_state: IncrementalState,
        beam: BeamState,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Encoder-decoder attention of the newest step; keys and values once per sentence."""
        cache = self._cache(incremental_state)
        if cache is None:
            if encoder_out is None:
                raise ValueError("the encoder output is needed on the first decoding step")
            group = beam.layout.group
            sentences = encoder_out[::group]
            mask = None if encoder_mask is None else encoder_mask[::group]
            cache = EncoderAttentionCache(
                beam,
                split_heads(self.k_proj(sentences), self.num_heads),
                split_heads(self.v_proj(sentences), self.num_heads),
                mask,
            )
            self._set_cache(incremental_state, cache)
        context, weights = cache.attend(self.q_proj(query), need_weights, self._dropout_p())
        return self.out_proj(context), weights

    @staticmethod
    def _step_by_step(incremental_state: Optional[IncrementalState],
                      beam: Optional[BeamState]) -> bool:
        """Whether a call decodes one step (it has an ``incremental_state``), which needs the
        decoder's :class:`BeamState`."""
        if incremental_state is None:
            return False
        if beam is None:
            raise ValueError("decoding step by step needs the decoder's BeamState (beam=)")
        return True

    def _dropout_p(self) -> float:
        """Dropout on the attention probabilities: in training mode only (also while decoding
        with ``--retain-dropout``, which puts the module in training mode)."""
        return self.dropout if self.training else 0.0

    # -- incremental state ----------------------------------------------------------------

    def _cache(self, incremental_state: IncrementalState) -> Optional[Cache]:
        saved = self.get_incremental_state(incremental_state, "attn_cache")
        return None if saved is None else saved["cache"]

    def _set_cache(self, incremental_state: IncrementalState, cache: Cache) -> None:
        self.set_incremental_state(incremental_state, "attn_cache", {"cache": cache})

    def reorder_beam(self, incremental_state: IncrementalState, reorder: BeamReorder) -> None:
        """Follow one beam reorder (the decoder computes it once for all its attentions)."""
        cache = self._cache(incremental_state)
        if cache is not None:
            cache.reorder(reorder)

