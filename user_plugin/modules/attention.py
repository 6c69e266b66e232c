"""Multi-head scaled dot-product attention (paper §3.2.1, §3.2.2).

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with
``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`` and
``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``.

The ``h`` per-head projections are stored as one matrix each (``q_proj``, ``k_proj``, ``v_proj``),
so all heads are computed by one matrix product. ``d_k`` and ``d_v`` default to ``d_model / h``
and may be set on their own (Table 3 row B).

The arithmetic of the fast path is PyTorch's ``scaled_dot_product_attention``, which picks a
fused kernel (flash / memory-efficient attention on a GPU). Attention weights are only computed,
by the explicit formula, when a caller asks for them (alignments, plots).

Tensors are batch-first: ``[batch, time, channels]``; per-head tensors are ``[batch, heads,
time, d_k]``. Masks are boolean with ``True`` meaning *may attend*, as SDPA expects.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from .beam_cache import BeamSelfAttentionCache
from .beam_groups import group_sentences, identical_row_groups, is_identity

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


@with_incremental_state
class MultiHeadAttention(nn.Module):
    """Multi-head attention with an optional key/value cache for incremental decoding.

    Args:
        embed_dim: d_model, the width of queries, keys, values and output.
        num_heads: h.
        key_dim: d_k per head (default d_model / h).
        value_dim: d_v per head (default d_model / h).
        dropout: dropout on the attention probabilities (0 in the paper).
        encoder_decoder: True for the decoder's encoder-decoder attention, whose keys and values
            come from the encoder output and are therefore computed once per sentence when
            decoding incrementally.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        key_dim: Optional[int] = None,
        value_dim: Optional[int] = None,
        dropout: float = 0.0,
        encoder_decoder: bool = False,
    ) -> None:
        super().__init__()
        if key_dim is None or value_dim is None:
            if embed_dim % num_heads != 0:
                raise ValueError(
                    f"embed dim {embed_dim} is not divisible by {num_heads} attention heads; "
                    "choose another --*-attention-heads or set --attention-key-dim and "
                    "--attention-value-dim"
                )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.key_dim = key_dim or embed_dim // num_heads
        self.value_dim = value_dim or embed_dim // num_heads
        self.dropout = dropout
        self.encoder_decoder = encoder_decoder
        self.q_proj = nn.Linear(embed_dim, num_heads * self.key_dim)
        self.k_proj = nn.Linear(embed_dim, num_heads * self.key_dim)
        self.v_proj = nn.Linear(embed_dim, num_heads * self.value_dim)
        self.out_proj = nn.Linear(num_heads * self.value_dim, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def _split_heads(self, x: Tensor, head_dim: int) -> Tensor:
        """[B, T, h * d] -> [B, h, T, d]."""
        batch, time, _ = x.shape
        return x.view(batch, time, self.num_heads, head_dim).transpose(1, 2)

    def forward(
        self,
        query: Tensor,
        key_value: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        is_causal: bool = False,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = False,
        beam_group: Optional[int] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` [B, T, C] to ``key_value`` [B, S, C].

        Args:
            attn_mask: boolean, broadcastable to [B, h, T, S], True where attending is allowed.
            is_causal: position i attends to positions <= i (decoder self-attention, §3.2.3).
            incremental_state: cache for step-by-step decoding (one query step per call).
                Self-attention keeps each step's key and value in a
                :class:`~user_plugin.modules.beam_cache.BeamSelfAttentionCache`;
                encoder-decoder attention computes them on the first step and reuses them
                (``key_value`` may then be None).
            need_weights: also return the attention probabilities [B, h, T, S].
            beam_group: with ``incremental_state``, the rows come as groups of this many
                consecutive hypotheses of one sentence (the beam), whose encoder outputs are
                identical. None: detected from the encoder output on the first step.
        """
        cache = self._get_cache(incremental_state)
        if cache is not None and not self.encoder_decoder:
            return self._attend_incremental(query, key_value, cache, incremental_state,
                                            beam_group, need_weights)
        q = self._split_heads(self.q_proj(query), self.key_dim)
        if cache is not None:  # encoder-decoder attention, decoding step by step
            if "key" not in cache:
                assert key_value is not None, "keys and values are needed on the first step"
                cache = self._encoder_cache(key_value, attn_mask, beam_group)
                self._set_cache(incremental_state, cache)
            if not need_weights and q.size(2) == 1 and cache["rows"] is None:
                return self._attend_per_sentence(q, cache), None
            k, v, attn_mask = _rows_of(cache)
        else:
            assert key_value is not None, "keys and values are needed"
            k = self._split_heads(self.k_proj(key_value), self.key_dim)
            v = self._split_heads(self.v_proj(key_value), self.value_dim)

        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            context, weights = _explicit_attention(q, k, v, attn_mask, is_causal, dropout_p)
        else:
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
            )
            weights = None
        return self._merge_heads(context), weights

    def _attend_incremental(
        self,
        query: Tensor,
        key_value: Optional[Tensor],
        cache: Dict,
        incremental_state: IncrementalState,
        beam_group: Optional[int],
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Self-attention of the newest step: store its key and value, attend to the prefix.

        The causal mask (§3.2.3) is implicit: the cache only holds earlier steps.
        """
        beam = cache.get("beam")
        if beam is None:
            beam = BeamSelfAttentionCache(beam_group or 1, self.num_heads, self.key_dim,
                                          self.value_dim)
            self._set_cache(incremental_state, {"beam": beam})
        source = query if key_value is None else key_value
        beam.append(self.k_proj(source), self.v_proj(source))
        context, weights = beam.attend(self.q_proj(query), need_weights)
        return self.out_proj(context), weights

    def _merge_heads(self, context: Tensor) -> Tensor:
        """[B, h, T, d_v] -> output projection of [B, T, h * d_v]."""
        batch, _, time, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, time, self.num_heads * self.value_dim)
        return self.out_proj(context)

    # -- encoder-decoder attention while decoding: keys and values once per sentence -------

    def _encoder_cache(
        self, encoder_out: Tensor, attn_mask: Optional[Tensor], group: Optional[int]
    ) -> Dict:
        """Keys and values of the distinct sentences of ``encoder_out`` [rows, S, C].

        Beam search hands the decoder ``beam`` identical copies of each sentence's encoder
        output, in consecutive rows (``group`` copies per sentence, detected when not given).
        The keys and values are computed and stored once per sentence; ``rows`` (None while
        row ``r`` belongs to sentence ``r // group``) maps decoder rows to stored sentences.
        """
        if group is None or group < 1 or encoder_out.size(0) % group:
            group = identical_row_groups(encoder_out, attn_mask)
        sentences = encoder_out[::group]
        mask = None if attn_mask is None else attn_mask[::group]
        return {
            "key": self._split_heads(self.k_proj(sentences), self.key_dim),
            "value": self._split_heads(self.v_proj(sentences), self.value_dim),
            "mask": mask,
            "group": group,
            "rows": None,
        }

    def _attend_per_sentence(self, q: Tensor, cache: Dict) -> Tensor:
        """One query step of the ``group`` hypotheses of each sentence against that sentence's
        stored keys: queries [n * group, h, 1, d] become [n, h, group, d] (no key copies)."""
        key, value, group = cache["key"], cache["value"], cache["group"]
        sentences = key.size(0)
        q = q.view(sentences, group, self.num_heads, self.key_dim).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, key, value, attn_mask=cache["mask"])
        context = context.transpose(1, 2).reshape(sentences * group, 1, self.num_heads
                                                  * self.value_dim)
        return self.out_proj(context)

    # -- incremental decoding -------------------------------------------------------------

    def _get_cache(self, incremental_state: Optional[IncrementalState]) -> Optional[Dict]:
        if incremental_state is None:
            return None
        return self.get_incremental_state(incremental_state, "attn_cache") or {}

    def _set_cache(self, incremental_state: IncrementalState, cache: Dict) -> None:
        self.set_incremental_state(incremental_state, "attn_cache", cache)

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: Tensor
    ) -> IncrementalState:
        """Follow beam search: keep the cached keys/values of the hypotheses in ``new_order``.

        Self-attention keys and values are not copied (see ``BeamSelfAttentionCache``).
        Encoder-decoder keys and values are stored per sentence: only the row -> sentence map
        follows ``new_order``, and the stored sentences are selected only when some leave the
        batch (or the rows stop being grouped by sentence).
        """
        cache = self.get_incremental_state(incremental_state, "attn_cache")
        if not cache:
            return incremental_state
        if "beam" in cache:
            cache["beam"].reorder(new_order)
            return incremental_state
        if "group" in cache:
            reordered = _reorder_sentence_cache(cache, new_order)
        else:
            reordered = {name: t.index_select(0, new_order) for name, t in cache.items()}
        self._set_cache(incremental_state, reordered)
        return incremental_state


def _rows_of(cache: Dict) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Per-row keys, values and mask of a per-sentence cache (general, copying path)."""
    rows = cache["rows"]
    if rows is None:
        count = cache["key"].size(0) * cache["group"]
        rows = torch.arange(count, device=cache["key"].device) // cache["group"]
    mask = cache["mask"]
    return cache["key"][rows], cache["value"][rows], None if mask is None else mask[rows]


def _reorder_sentence_cache(cache: Dict, new_order: Tensor) -> Dict:
    """Compose the row -> sentence map with ``new_order``; when the rows are again ``group``
    consecutive rows per sentence, keep only those sentences, in that order."""
    group, rows = cache["group"], cache["rows"]
    if rows is None:
        rows = torch.arange(cache["key"].size(0) * group, device=new_order.device) // group
    rows = rows.index_select(0, new_order)
    new = dict(cache, rows=rows)
    sentences = group_sentences(rows, group)
    if sentences is not None:
        new["rows"] = None
        if not is_identity(sentences, cache["key"].size(0)):
            new["key"] = cache["key"].index_select(0, sentences)
            new["value"] = cache["value"].index_select(0, sentences)
            if cache["mask"] is not None:
                new["mask"] = cache["mask"].index_select(0, sentences)
    return new


def _explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Optional[Tensor],
    is_causal: bool,
    dropout_p: float,
) -> Tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V written out, returning the probabilities as well (§3.2.1)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.size(-2), k.size(-2), q.device), -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    probs = torch.softmax(scores.float(), dim=-1).type_as(scores)
    context = torch.matmul(F.dropout(probs, p=dropout_p), v)
    return context, probs


def causal_mask(query_len: int, key_len: int, device: torch.device) -> Tensor:
    """[T, S] boolean, True where query i may see key j (j <= i, aligned at the end)."""
    offset = key_len - query_len
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(offset)


def key_padding_to_attn_mask(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """[B, S] (True = pad) -> [B, 1, 1, S] (True = may attend), or None when nothing is padded."""
    if key_padding_mask is None:
        return None
    return (~key_padding_mask)[:, None, None, :]
