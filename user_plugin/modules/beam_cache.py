"""The attention caches of step-by-step decoding under beam search (§3.2.3, §6.1).

Decoding one target position at a time, each attention keeps the keys and values it has already
computed. Beam search reorders its hypotheses after every step; the usual cache follows by
copying all cached keys and values of every layer (``index_select``), after growing them by
concatenation (``cat``): the largest cost of CPU decoding (docs/benchmark.md).

Both caches here store per *sentence*, as the :class:`~.beam_state.BeamState` lays rows out, and
copy nothing on a reorder that keeps hypotheses within their sentences:

* :class:`SelfAttentionCache`: hypothesis ``j`` of sentence ``i`` writes step ``s``'s key and
  value once, into slot ``[i, s, j]`` of a buffer that grows by doubling. The ``group``
  queries of a sentence attend to all ``group * steps`` keys of that sentence in one call,
  masked by the beam state's prefix mask so that every hypothesis sees exactly its own prefix:
  the same softmax over the same keys as a copied cache (more multiply-adds, no copies).
* :class:`EncoderAttentionCache`: the encoder-decoder keys and values, computed once per
  sentence on the first step (beam search hands the decoder ``group`` identical copies of each
  sentence's encoder output).
* :class:`CrossSelfAttentionCache`: both at once, for cross+self-attention (the decoder's
  self-attention over the encoder output followed by its own prefix): the encoder part once per
  sentence, the prefix part as the self-attention cache, one softmax over the two.

Keys are copied only when sentences leave the batch, and then only those of as many remaining
sentences as left (:class:`~.beam_state.BeamState` moves them into the freed buffer rows); or,
should hypotheses ever move across sentences, once, to one row per hypothesis. Each cache
attends in its buffers' order of sentences and puts the outputs back in the batch's.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .beam_state import BeamReorder, BeamState, grow_steps
from .scaled_dot_product import attend, merge_heads, split_heads


def _by_sentence(rows: Tensor, beam: BeamState, num_heads: int) -> Tensor:
    """``[rows, 1, h * d]`` -> ``[sentences, h, group, d]``: a sentence's hypotheses side by side
    as one block of queries."""
    layout = beam.layout
    return split_heads(rows.view(layout.sentences, layout.group, -1), num_heads)


def _store(step_buffer: Tensor, step: Tensor, beam: BeamState) -> None:
    """Write one step ``[sentences, group, h, d]`` (the batch's order) into its buffer slice
    ``[buffer rows, group, h, d]`` at the sentences' rows."""
    if beam.buffer_rows is None:
        step_buffer[: step.size(0)] = step
    else:
        step_buffer.index_copy_(0, beam.buffer_rows, step)


def _by_row(per_sentence: Tensor, beam: BeamState) -> Tensor:
    """``[sentences, h, group, d]`` -> ``[rows, 1, h * d]``."""
    return merge_heads(per_sentence).reshape(beam.rows, 1, -1)


class SelfAttentionCache:
    """Keys/values ``[sentences, capacity, group, heads, d]`` of the decoder's earlier steps.

    Args:
        beam: the decoder's beam state (layout, step count, ancestry, prefix mask).
        num_heads, key_dim, value_dim: the attention's h, d_k and d_v.
    """

    def __init__(self, beam: BeamState, num_heads: int, key_dim: int, value_dim: int) -> None:
        self.beam = beam
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None

    def append(self, key: Tensor, value: Tensor) -> None:
        """Store the current step's projected keys and values, each ``[rows, 1, h * d]``."""
        rows, steps, _ = key.shape
        if steps != 1:
            raise ValueError(f"incremental self-attention takes one step at a time, got {steps}")
        beam = self.beam
        if rows != beam.rows:
            raise ValueError(
                f"the cache holds {beam.rows} hypotheses, the step has {rows}: "
                "reorder_incremental_state must follow every change of the batch"
            )
        step = beam.steps - 1
        if self.keys is None:
            shape = (beam.layout.sentences, beam.ancestry.size(1), beam.layout.group,
                     self.num_heads)
            self.keys = key.new_empty(shape + (self.key_dim,))
            self.values = value.new_empty(shape + (self.value_dim,))
        elif step == self.keys.size(1):
            self.keys = grow_steps(self.keys, step)
            self.values = grow_steps(self.values, step)
        sentences, group = beam.layout.sentences, beam.layout.group
        _store(self.keys[:, step], key.view(sentences, group, self.num_heads, self.key_dim), beam)
        _store(self.values[:, step], value.view(sentences, group, self.num_heads, self.value_dim),
               beam)

    def attend(self, query: Tensor, need_weights: bool = False,
               dropout_p: float = 0.0) -> Tuple[Tensor, Optional[Tensor]]:
        """Attention of ``query [rows, 1, h * d_k]`` over each hypothesis' own prefix.

        Returns the context ``[rows, 1, h * d_v]`` and, if asked, the probabilities
        ``[rows, h, 1, steps]`` over the hypothesis' prefix. ``dropout_p``: dropout on the
        probabilities (decoding with ``--retain-dropout``).
        """
        beam = self.beam
        k, v = self.stored()
        q = beam.to_buffer(_by_sentence(query, beam, self.num_heads))
        context, probs = attend(q, k, v, beam.prefix_mask(), dropout_p=dropout_p,
                                need_weights=need_weights)
        weights = None if probs is None else self.per_hypothesis(beam.from_buffer(probs))
        return _by_row(beam.from_buffer(context), beam), weights

    def stored(self) -> Tuple[Tensor, Tensor]:
        """Each sentence's stored keys and values, ``[sentences, h, steps * group, d]``, in the
        buffers' order of sentences and the order :meth:`BeamState.prefix_mask` masks them."""
        assert self.keys is not None and self.values is not None, "append before attend"
        beam, heads = self.beam, self.num_heads
        sentences, group, steps = beam.layout.sentences, beam.layout.group, beam.steps
        k = self.keys[:sentences, :steps].reshape(sentences, steps * group, heads, self.key_dim)
        v = self.values[:sentences, :steps].reshape(sentences, steps * group, heads,
                                                    self.value_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def reorder(self, reorder: BeamReorder) -> None:
        """Follow a beam reorder: copy only when sentences leave (into the freed rows, in
        place), or once into new buffers on a fall-back."""
        if self.keys is None or self.values is None:
            return
        if reorder.ungroups:
            self.keys = self._ungrouped(self.keys, reorder)
            self.values = self._ungrouped(self.values, reorder)
        elif reorder.source_rows is not None:
            self.keys = self._selected(self.keys, reorder.source_rows)
            self.values = self._selected(self.values, reorder.source_rows)
        elif reorder.moves is not None:
            steps = self.beam.steps
            reorder.follow_in_buffer(self.keys[:, :steps])
            reorder.follow_in_buffer(self.values[:, :steps])

    def _selected(self, buffer: Tensor, rows: Tensor) -> Tensor:
        """The filled prefix of ``buffer``'s ``rows``, in a new buffer of the same capacity."""
        steps = self.beam.steps
        out = buffer.new_empty((rows.numel(),) + tuple(buffer.shape[1:]))
        out[:, :steps] = buffer[:, :steps].index_select(0, rows)
        return out

    def _ungrouped(self, buffer: Tensor, reorder: BeamReorder) -> Tensor:
        """Each new row's own prefix in a row of its own (``group`` 1)."""
        steps = self.beam.steps
        slots = reorder.prefix_slots
        assert slots is not None and reorder.source_rows is not None, "set by BeamState.follow"
        sentence = reorder.source_rows[:, None]
        step = torch.arange(steps, device=slots.device)[None, :]
        out = buffer.new_empty((reorder.after.rows, buffer.size(1), 1) + tuple(buffer.shape[3:]))
        out[:, :steps, 0] = buffer[sentence, step, slots]
        return out

    def per_hypothesis(self, probs: Tensor) -> Tensor:
        """``[sentences, h, group, steps * group]`` -> each row's weights over its own prefix,
        ``[rows, h, 1, steps]``."""
        sentences, heads, group, _ = probs.shape
        steps = self.beam.steps
        slot = self.beam.ancestry[:, :steps].view(sentences, 1, group, steps, 1)
        slot = slot.expand(sentences, heads, group, steps, 1)
        own = probs.view(sentences, heads, group, steps, group).gather(-1, slot).squeeze(-1)
        return own.transpose(1, 2).reshape(sentences * group, heads, 1, steps)


class EncoderAttentionCache:
    """The encoder-decoder keys ``[sentences, h, S, d_k]``, values and mask, once per sentence.

    Args:
        beam: the decoder's beam state.
        key, value: the projected keys and values of one encoder output per sentence
            (``[sentences, h, S, d]``), the cache's own: it moves their rows in place.
        mask: ``[sentences, 1, 1, S]`` (True = real source token), or None without padding.
    """

    def __init__(self, beam: BeamState, key: Tensor, value: Tensor,
                 mask: Optional[Tensor]) -> None:
        self.beam = beam
        self.key = key
        self.value = value
        # rows move in place when sentences leave: the decoder shares one mask between layers
        self.mask = None if mask is None else mask.clone()

    def attend(self, query: Tensor, need_weights: bool = False,
               dropout_p: float = 0.0) -> Tuple[Tensor, Optional[Tensor]]:
        """The ``group`` queries ``[rows, 1, h * d_k]`` of each sentence against that
        sentence's keys. Returns the context ``[rows, 1, h * d_v]`` and, if asked, the
        probabilities ``[rows, h, 1, S]``; ``dropout_p`` as :meth:`SelfAttentionCache.attend`."""
        beam, heads = self.beam, self.key.size(1)
        key, value, mask = self.stored()
        q = beam.to_buffer(_by_sentence(query, beam, heads))
        context, probs = attend(q, key, value, mask, dropout_p=dropout_p,
                                need_weights=need_weights)
        weights = None
        if probs is not None:
            weights = beam.from_buffer(probs).transpose(1, 2).reshape(beam.rows, heads, 1, -1)
        return _by_row(beam.from_buffer(context), beam), weights

    def stored(self) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """The keys, values and mask of the batch's sentences, in the buffers' order."""
        sentences = self.beam.layout.sentences
        mask = None if self.mask is None else self.mask[:sentences]
        return self.key[:sentences], self.value[:sentences], mask

    def reorder(self, reorder: BeamReorder) -> None:
        """Follow the sentences that remain (one row per hypothesis after a fall-back)."""
        self.key = reorder.follow_in_buffer(self.key)
        self.value = reorder.follow_in_buffer(self.value)
        if self.mask is not None:
            self.mask = reorder.follow_in_buffer(self.mask)


class CrossSelfAttentionCache:
    """Keys of cross+self-attention: a sentence's encoder keys (stored once per sentence, as
    :class:`EncoderAttentionCache`) followed by each hypothesis' own prefix (as
    :class:`SelfAttentionCache`); every query attends to both under one softmax.

    Args:
        beam: the decoder's beam state.
        key, value: the projected encoder output, once per sentence (``[sentences, h, S, d]``).
        mask: ``[sentences, 1, 1, S]`` (True = real source token), or None without padding.
        num_heads, key_dim, value_dim: the attention's h, d_k and d_v.
    """

    def __init__(self, beam: BeamState, key: Tensor, value: Tensor, mask: Optional[Tensor],
                 num_heads: int, key_dim: int, value_dim: int) -> None:
        self.encoder = EncoderAttentionCache(beam, key, value, mask)
        self.prefix = SelfAttentionCache(beam, num_heads, key_dim, value_dim)

    def append(self, key: Tensor, value: Tensor) -> None:
        """Store the current step's projected key and value, each ``[rows, 1, h * d]``."""
        self.prefix.append(key, value)

    def attend(self, query: Tensor, need_weights: bool = False,
               dropout_p: float = 0.0) -> Tuple[Tensor, Optional[Tensor]]:
        """Attention of ``query [rows, 1, h * d_k]`` over its sentence's source and its own
        prefix. Returns the context ``[rows, 1, h * d_v]`` and, if asked, the probabilities
        ``[rows, h, 1, S + steps]`` (source positions first); ``dropout_p`` as
        :meth:`SelfAttentionCache.attend`."""
        beam = self.prefix.beam
        source_k, source_v, source_mask = self.encoder.stored()
        prefix_k, prefix_v = self.prefix.stored()
        k = torch.cat([source_k, prefix_k], dim=2)
        v = torch.cat([source_v, prefix_v], dim=2)
        q = beam.to_buffer(_by_sentence(query, beam, self.prefix.num_heads))
        context, probs = attend(q, k, v, self._mask(q, source_mask), dropout_p=dropout_p,
                                need_weights=need_weights)
        context = beam.from_buffer(context)
        weights = None
        if probs is not None:
            probs = beam.from_buffer(probs)
            source = source_k.size(2)
            to_source = probs[..., :source].transpose(1, 2).reshape(beam.rows, -1, 1, source)
            to_prefix = self.prefix.per_hypothesis(probs[..., source:].contiguous())
            weights = torch.cat([to_source, to_prefix], dim=-1)
        return _by_row(context, beam), weights

    def _mask(self, q: Tensor, source_mask: Optional[Tensor]) -> Optional[Tensor]:
        """``[sentences, 1, group, S + steps * group]``, in the buffers' order: the real source
        tokens (``source_mask``), then the hypothesis' own prefix; None when nothing is hidden."""
        prefix_mask = self.prefix.beam.prefix_mask()
        if source_mask is None and prefix_mask is None:
            return None
        sentences, _, group, _ = q.shape
        source, stored = self.encoder.key.size(2), self.prefix.beam.steps * group
        if source_mask is None:
            source_mask = q.new_ones((1, 1, 1, 1), dtype=torch.bool)
        if prefix_mask is None:
            prefix_mask = q.new_ones((1, 1, 1, 1), dtype=torch.bool)
        return torch.cat([source_mask.expand(sentences, 1, group, source),
                          prefix_mask.expand(sentences, 1, group, stored)], dim=-1)

    def reorder(self, reorder: BeamReorder) -> None:
        """Follow a beam reorder (copies only when sentences leave, or once on a fall-back)."""
        self.encoder.reorder(reorder)
        self.prefix.reorder(reorder)
