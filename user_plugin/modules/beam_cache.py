"""Decoder self-attention keys and values during beam search (paper §3.2.3, §6.1).

Step-by-step decoding (§3.2.3: position ``i`` attends to positions ``<= i``) keeps every earlier
step's keys and values. Beam search (§6.1, beam 4) then reorders the hypotheses after every step,
and the usual cache follows it by copying all cached keys and values of every layer
(``index_select``), after having grown them by concatenation (``cat``): two full copies per layer
and step, which profiling showed to be the largest cost of decoding on a CPU.

:class:`BeamSelfAttentionCache` never copies on a reorder. The ``group`` hypotheses of a
sentence (consecutive rows ``i * group + j``) write the key and value of step ``s`` once, into
slot ``[i, s, j]`` of a buffer that grows by doubling. A reorder inside sentences only permutes
a small ``ancestry`` table: ``ancestry[r, s]`` is the slot ``j`` holding step ``s`` of
hypothesis ``r``'s prefix. Each step, the ``group`` queries of a sentence attend to all
``group * steps`` keys of that sentence in one call, masked so that every hypothesis sees
exactly its own prefix: the same softmax over the same keys as with copied caches (more
multiply-adds, no copies). Keys are copied only when sentences leave the batch, and a reorder
that mixes sentences falls back to one hypothesis per "sentence" (``group = 1``).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .beam_groups import is_identity, sentences_of_reorder

# steps stored before the first doubling: most translations are shorter, so the buffers rarely
# grow (each growth copies them); on a CPU, pages of the unused tail are never touched
INITIAL_CAPACITY = 128


class BeamSelfAttentionCache:
    """Keys/values ``[sentences, capacity, group, heads, d]`` plus ``ancestry [rows, capacity]``.

    Args:
        group: hypotheses per sentence (the beam size), in consecutive rows; 1 if unknown.
        num_heads, key_dim, value_dim: the attention's h, d_k and d_v.
    """

    def __init__(self, group: int, num_heads: int, key_dim: int, value_dim: int) -> None:
        if group < 1:
            raise ValueError(f"group must be >= 1, got {group}")
        self.group = group
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.length = 0
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None
        self.ancestry: Optional[Tensor] = None
        self._own_slots: Optional[Tensor] = None  # r % group for every row r (see _slots)

    @property
    def rows(self) -> int:
        return 0 if self.ancestry is None else self.ancestry.size(0)

    def append(self, key: Tensor, value: Tensor) -> None:
        """Store the newest step's projected keys and values, each ``[rows, 1, heads * d]``."""
        rows, steps, _ = key.shape
        if steps != 1:
            raise ValueError(f"incremental self-attention takes one step at a time, got {steps}")
        if self.keys is None:
            if rows % self.group:
                self.group = 1
            self._allocate(rows, key, value)
        elif rows != self.rows:
            raise ValueError(
                f"the cache holds {self.rows} hypotheses, the step has {rows}: "
                "reorder_incremental_state must follow every change of the batch"
            )
        if self.length == self.keys.size(1):
            self._grow()
        sentences, group = rows // self.group, self.group
        self.keys[:, self.length] = key.view(sentences, group, self.num_heads, self.key_dim)
        self.values[:, self.length] = value.view(sentences, group, self.num_heads, self.value_dim)
        self.ancestry[:, self.length] = self._slots()
        self.length += 1

    def attend(self, query: Tensor, need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """Attention of ``query [rows, 1, heads * d_k]`` over each hypothesis' own prefix.

        Returns the context ``[rows, 1, heads * d_v]`` and, if asked, the probabilities
        ``[rows, heads, 1, steps]`` over the hypothesis' prefix.
        """
        rows, group, steps = self.rows, self.group, self.length
        sentences, heads = rows // group, self.num_heads
        assert self.keys is not None and self.values is not None and self.ancestry is not None
        q = query.view(sentences, group, heads, self.key_dim).transpose(1, 2)
        k = self.keys[:, :steps].reshape(sentences, steps * group, heads, self.key_dim)
        v = self.values[:, :steps].reshape(sentences, steps * group, heads, self.value_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        mask = None
        if group > 1:
            slots = self._slots()[:group]
            own = self.ancestry[:, :steps].reshape(sentences, group, steps, 1) == slots
            mask = own.view(sentences, 1, group, steps * group)
        weights = None
        if need_weights:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.key_dim)
            if mask is not None:
                scores = scores.masked_fill(~mask, -math.inf)
            probs = torch.softmax(scores.float(), dim=-1).type_as(scores)
            context = torch.matmul(probs, v)
            weights = self._per_hypothesis(probs)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        context = context.transpose(1, 2).reshape(rows, 1, heads * self.value_dim)
        return context, weights

    def reorder(self, new_order: Tensor) -> None:
        """Follow beam search: row ``r`` continues hypothesis ``new_order[r]``."""
        if self.keys is None:
            return
        sentences = sentences_of_reorder(new_order, self.group)
        if sentences is None:  # hypotheses move across sentences: one row per "sentence"
            self._ungroup()
            sentences = new_order
        self.ancestry = self.ancestry.index_select(0, new_order)
        if not is_identity(sentences, self.keys.size(0)):
            self.keys = self._select(self.keys, sentences)
            self.values = self._select(self.values, sentences)

    # -- internals -------------------------------------------------------------------------

    def _slots(self) -> Tensor:
        """The slot each row writes its newest step to (``r % group``), kept between steps."""
        rows = self.rows
        if self._own_slots is None or self._own_slots.numel() != rows:
            device = self.ancestry.device
            self._own_slots = torch.arange(self.group, device=device).repeat(rows // self.group)
        return self._own_slots

    def _allocate(self, rows: int, key: Tensor, value: Tensor, capacity: int = 0) -> None:
        sentences, group = rows // self.group, self.group
        capacity = max(capacity, INITIAL_CAPACITY)
        shape = (sentences, capacity, group, self.num_heads)
        self.keys = key.new_empty(shape + (self.key_dim,))
        self.values = value.new_empty(shape + (self.value_dim,))
        self.ancestry = torch.zeros(rows, capacity, dtype=torch.long, device=key.device)

    def _grow(self) -> None:
        """Double the capacity (amortised O(1) copies per step)."""
        keys, values, ancestry, length = self.keys, self.values, self.ancestry, self.length
        self._allocate(ancestry.size(0), keys, values, capacity=2 * keys.size(1))
        self.keys[:, :length] = keys[:, :length]
        self.values[:, :length] = values[:, :length]
        self.ancestry[:, :length] = ancestry[:, :length]

    def _select(self, buffer: Tensor, sentences: Tensor) -> Tensor:
        """The filled prefix of ``buffer`` for ``sentences``, in a buffer of the same capacity."""
        out = buffer.new_empty((sentences.numel(),) + tuple(buffer.shape[1:]))
        out[:, : self.length] = buffer[:, : self.length].index_select(0, sentences)
        return out

    def _ungroup(self) -> None:
        """Copy every hypothesis' own prefix into its own row (``group`` becomes 1)."""
        group = self.group
        if group == 1:
            return
        rows, length = self.rows, self.length
        sentence = torch.arange(rows, device=self.ancestry.device).div(group, rounding_mode="floor")
        step = torch.arange(length, device=sentence.device)
        slot = self.ancestry[:, :length]
        keys, values = self.keys, self.values
        self.group = 1
        self._own_slots = None
        self._allocate(rows, keys, values, capacity=keys.size(1))
        self.keys[:, :length, 0] = keys[sentence[:, None], step[None, :], slot]
        self.values[:, :length, 0] = values[sentence[:, None], step[None, :], slot]

    def _per_hypothesis(self, probs: Tensor) -> Tensor:
        """[sentences, heads, group, steps * group] -> each row's weights over its own prefix."""
        sentences, heads, group, _ = probs.shape
        steps = self.length
        slot = self.ancestry[:, :steps].view(sentences, 1, group, steps, 1)
        slot = slot.expand(sentences, heads, group, steps, 1)
        own = probs.view(sentences, heads, group, steps, group).gather(-1, slot).squeeze(-1)
        return own.transpose(1, 2).reshape(sentences * group, heads, 1, steps)
