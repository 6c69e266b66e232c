"""How beam search (§6.1) lays out the decoder's rows, decided once and shared by every cache.

fairseq's ``SequenceGenerator`` expands a batch of ``n`` sentences into ``n * beam`` rows, the
``beam`` hypotheses of sentence ``i`` in rows ``i * beam ... i * beam + beam - 1``. After every
step it reorders the rows (``new_order``): each hypothesis continues one of its own sentence's
hypotheses, and finished sentences leave. Everything the decoder keeps per sentence (encoder
keys and values, self-attention keys and values) then only has to follow the *sentences*, and
the rest is bookkeeping of which hypothesis continues which.

* :class:`BeamLayout`: rows as ``sentences`` blocks of ``group`` hypotheses. The encoder makes
  it where beam search first expands the batch (``BeamLayout.of_expansion``).
* :class:`BeamReorder`: what one ``new_order`` means for per-sentence data, computed once per
  step by :meth:`BeamLayout.follow`: which old sentence each new sentence continues (None when
  nothing moves), or, should hypotheses ever move across sentences, a fall-back to one row per
  "sentence" (``group`` 1).
* :class:`BeamState`: the decoder's single record while decoding: the layout, the number of
  steps, the *ancestry* of every hypothesis (``ancestry[r, s]``: the hypothesis, counted
  within its sentence, whose step ``s`` is on row ``r``'s prefix), and where each sentence's
  data lies in the caches' per-sentence buffers (:attr:`BeamState.buffer_rows`). Every layer's
  caches read the same ancestry, prefix mask and buffer rows, all kept here.

When sentences leave the batch, the caches keep their buffers: the sentences that remain keep
their rows, and only those stored past the new number of sentences move into the rows that
were freed, so a step copies the data of as many sentences as left (not of all that remain).
The buffers' rows are then a permutation of the batch's sentences, which the caches undo on
the small per-step tensors (queries and outputs), never on the stored keys.

A layout of ``group`` 1 (no beam, or rows not grouped) is exact too; it only copies more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch
from torch import Tensor

# steps stored before the first doubling: most translations are shorter, so buffers rarely grow
INITIAL_CAPACITY = 128


@dataclass(frozen=True)
class BeamLayout:
    """The decoder's rows: ``sentences`` blocks of ``group`` consecutive hypotheses each."""

    sentences: int
    group: int = 1

    def __post_init__(self) -> None:
        if self.group < 1:
            raise ValueError(f"a beam group must hold at least one hypothesis, got {self.group}")

    @property
    def rows(self) -> int:
        return self.sentences * self.group

    @classmethod
    def of_expansion(cls, new_order: Tensor, rows: int) -> Optional["BeamLayout"]:
        """The layout made by beam search's first reorder, which repeats each of ``rows``
        sentences ``g >= 2`` times in a row; None for any other reorder."""
        if rows <= 0 or new_order.numel() == rows or new_order.numel() % rows:
            return None
        group = new_order.numel() // rows
        expected = torch.arange(rows, device=new_order.device).repeat_interleave(group)
        return cls(rows, group) if torch.equal(new_order, expected) else None

    def follow(self, new_order: Tensor) -> "BeamReorder":
        """What ``new_order`` (row ``r`` continues row ``new_order[r]``) does to sentences."""
        group = self.group
        old_sentence = new_order.div(group, rounding_mode="floor") if group > 1 else new_order
        sentences = _block_values(old_sentence, group)
        if sentences is None:  # hypotheses move across sentences: one row per "sentence"
            return BeamReorder(new_order, self, BeamLayout(new_order.numel()), old_sentence)
        after = BeamLayout(sentences.numel(), group)
        unchanged = sentences.numel() == self.sentences and bool(
            sentences.eq(torch.arange(self.sentences, device=sentences.device)).all()
        )
        return BeamReorder(new_order, self, after, None if unchanged else sentences)


@dataclass(frozen=True)
class BeamReorder:
    """One beam reorder, as per-sentence data sees it.

    Attributes:
        new_order: row ``r`` continues row ``new_order[r]`` (fairseq's argument).
        before, after: the layouts around the reorder.
        sentences: for each sentence of ``after``, the sentence of ``before`` it continues;
            None when the sentences stay as they are (nothing to select).
        prefix_slots: set by :class:`BeamState` when the reorder ungroups: for each new row,
            the slot of each step of its prefix (the ancestry before the fall-back).
        source_rows: set by :class:`BeamState` when per-sentence buffers have to be gathered
            anew (the reorder ungroups, or continues a sentence twice): for each new row (new
            sentence), the buffer row of the sentence it continues.
        moves: set by :class:`BeamState` when sentences leave: ``(to, from)``, the buffer rows
            that per-sentence buffers copy in place (``buffer[to] = buffer[from]``), after
            which rows ``0 .. after.sentences - 1`` hold the remaining sentences; None when
            nothing moves.
    """

    new_order: Tensor
    before: BeamLayout
    after: BeamLayout
    sentences: Optional[Tensor]
    prefix_slots: Optional[Tensor] = None
    source_rows: Optional[Tensor] = None
    moves: Optional[Tuple[Tensor, Tensor]] = None

    @property
    def ungroups(self) -> bool:
        """Hypotheses moved across sentences: per-sentence data becomes per-row data."""
        return self.after.group == 1 and self.before.group > 1

    def follow_in_buffer(self, buffer: Tensor) -> Tensor:
        """A per-sentence buffer (first dimension: buffer rows) after this reorder: rows moved
        in place, or gathered into a new buffer (``source_rows``)."""
        if self.source_rows is not None:
            return buffer.index_select(0, self.source_rows)
        if self.moves is not None:
            to, source = self.moves
            buffer.index_copy_(0, to, buffer.index_select(0, source))
        return buffer


class BeamState:
    """The decoder's beam record: layout, steps taken, and each hypothesis' ancestry.

    The decoder calls :meth:`advance` once per step before its layers run and :meth:`follow`
    once per beam reorder; caches read :attr:`steps`, :attr:`ancestry` and :meth:`prefix_mask`.
    """

    def __init__(self, layout: BeamLayout, device: torch.device) -> None:
        self.layout = layout
        self.steps = 0
        self.ancestry = torch.empty(layout.rows, INITIAL_CAPACITY, dtype=torch.long,
                                    device=device)
        self._own_slots = self._slots_of(layout)
        self._mask: Optional[Tensor] = None
        self._mask_steps = -1
        # the buffer row of each sentence in the caches' per-sentence buffers; None: row i
        self.buffer_rows: Optional[Tensor] = None
        self._buffer_order: Optional[Tensor] = None  # the sentence in each buffer row

    @property
    def rows(self) -> int:
        return self.layout.rows

    def advance(self, rows: int) -> None:
        """Start a step of ``rows`` hypotheses: each writes its newest step to its own slot."""
        if rows != self.rows:
            raise ValueError(
                f"the beam holds {self.rows} hypotheses, the step has {rows}: "
                "reorder_incremental_state must follow every change of the batch"
            )
        if self.steps == self.ancestry.size(1):
            self.ancestry = grow_steps(self.ancestry, self.steps)
        self.ancestry[:, self.steps] = self._own_slots
        self.steps += 1

    def follow(self, new_order: Tensor) -> BeamReorder:
        """Apply a beam reorder to the ancestry and return it for the caches to follow."""
        reorder = self.layout.follow(new_order)
        ancestry = self.ancestry.index_select(0, new_order)
        if reorder.ungroups:
            reorder = replace(reorder, prefix_slots=ancestry[:, : self.steps],
                              source_rows=self._rows_of(reorder.sentences))
            ancestry = torch.zeros_like(ancestry)  # every hypothesis owns its row: slot 0
            self._set_buffer_rows(None)  # each cache makes a new buffer, one row per hypothesis
        elif reorder.sentences is not None:
            reorder = self._compact(reorder)
        self.ancestry = ancestry
        if reorder.after != self.layout:
            self._own_slots = self._slots_of(reorder.after)
        self.layout = reorder.after
        self._mask_steps = -1
        return reorder

    def prefix_mask(self) -> Optional[Tensor]:
        """``[sentences, 1, group, steps * group]``, in the buffers' order of sentences
        (:meth:`to_buffer`): which of its sentence's stored keys each hypothesis sees (its own
        prefix, §3.2.3); None with one hypothesis per sentence."""
        if self.layout.group == 1:
            return None
        if self._mask_steps != self.steps:
            sentences, group, steps = self.layout.sentences, self.layout.group, self.steps
            own = self.ancestry[:, :steps].reshape(sentences, group, steps, 1)
            own = own == self._own_slots[:group]
            self._mask = self.to_buffer(own.view(sentences, 1, group, steps * group))
            self._mask_steps = steps
        return self._mask

    def to_buffer(self, per_sentence: Tensor) -> Tensor:
        """``per_sentence`` (one entry per sentence, in the batch's order) in the order of the
        caches' buffer rows."""
        if self._buffer_order is None:
            return per_sentence
        return per_sentence.index_select(0, self._buffer_order)

    def from_buffer(self, per_row: Tensor) -> Tensor:
        """The inverse of :meth:`to_buffer`: entries in buffer order back in the batch's."""
        if self.buffer_rows is None:
            return per_row
        return per_row.index_select(0, self.buffer_rows)

    def _rows_of(self, sentences: Tensor) -> Tensor:
        """The buffer rows of ``sentences`` (indices in the batch before a reorder)."""
        return sentences if self.buffer_rows is None else self.buffer_rows[sentences]

    def _compact(self, reorder: BeamReorder) -> BeamReorder:
        """Keep the sentences that remain (``reorder.sentences``, in their new order) in buffer
        rows ``0 .. n - 1``: each keeps its row if it is below ``n``, the others move into the
        rows freed by the sentences that left (``reorder.moves``).

        A sentence continued twice (which beam search never asks, but a reorder may) needs a
        copy of its data in a row of its own: the caches then gather every remaining sentence
        into new buffers (``reorder.source_rows``)."""
        held = self._rows_of(reorder.sentences)
        count = held.numel()
        if torch.unique(held).numel() != count:
            self._set_buffer_rows(None)
            return replace(reorder, source_rows=held)
        outside = held >= count
        taken = torch.zeros(count, dtype=torch.bool, device=held.device)
        taken[held[~outside]] = True
        freed = (~taken).nonzero().squeeze(1)
        moves = (freed, held[outside]) if freed.numel() else None
        held = held.clone()
        held[outside] = freed
        in_place = bool(held.eq(torch.arange(count, device=held.device)).all())
        self._set_buffer_rows(None if in_place else held)
        return replace(reorder, moves=moves)

    def _set_buffer_rows(self, rows: Optional[Tensor]) -> None:
        self.buffer_rows = rows
        self._buffer_order = None if rows is None else torch.argsort(rows)

    def _slots_of(self, layout: BeamLayout) -> Tensor:
        """``r % group`` for every row ``r``: the slot each hypothesis writes its steps to."""
        device = self.ancestry.device
        return torch.arange(layout.group, device=device).repeat(layout.sentences)


def _block_values(values: Tensor, group: int) -> Optional[Tensor]:
    """The common value of each block of ``group`` consecutive entries, or None when some block
    mixes values."""
    if group == 1:
        return values
    if values.numel() % group:
        return None
    blocks = values.view(-1, group)
    first = blocks[:, 0]
    return first if bool(blocks.eq(first[:, None]).all()) else None


def grow_steps(buffer: Tensor, filled: int) -> Tensor:
    """``buffer`` with twice the capacity along dimension 1 (steps), its first ``filled`` steps
    kept: doubling costs amortised O(1) copies per step."""
    shape = list(buffer.shape)
    shape[1] *= 2
    out = buffer.new_empty(shape)
    out[:, :filled] = buffer[:, :filled]
    return out
