"""How beam search lays out hypotheses in a batch (paper §6.1): ``group`` consecutive rows per
sentence. The caches and the encoder output use these helpers to tell a reorder that keeps
every hypothesis within its sentence (nothing to copy) from one that moves sentences or mixes
them."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def group_sentences(sentence_of_row: Tensor, group: int) -> Optional[Tensor]:
    """The sentence of each block of ``group`` consecutive rows, or None when some block
    holds rows of different sentences (or the rows do not split into blocks)."""
    if group == 1:
        return sentence_of_row
    if sentence_of_row.numel() % group:
        return None
    blocks = sentence_of_row.view(-1, group)
    sentences = blocks[:, 0]
    return sentences if bool(blocks.eq(sentences[:, None]).all()) else None


def sentences_of_reorder(new_order: Tensor, group: int) -> Optional[Tensor]:
    """:func:`group_sentences` of a beam reorder: row ``r`` continues row ``new_order[r]``,
    which belongs to sentence ``new_order[r] // group``."""
    return group_sentences(new_order.div(group, rounding_mode="floor"), group)


def is_identity(index: Tensor, size: int) -> bool:
    """``index`` selects all ``size`` entries, in order (selecting would change nothing)."""
    return index.numel() == size and bool(
        index.eq(torch.arange(size, device=index.device)).all()
    )


def identical_row_groups(encoder_out: Tensor, attn_mask: Optional[Tensor]) -> int:
    """The number ``g`` of consecutive identical rows per sentence (1 if rows are not grouped)."""
    rows = encoder_out.size(0)
    if rows < 2:
        return 1
    same_as_first = encoder_out.eq(encoder_out[:1]).flatten(1).all(dim=1)
    different = torch.nonzero(~same_as_first)
    group = int(different[0, 0]) if different.numel() else rows
    if group < 2 or rows % group:
        return 1
    for tensor in (encoder_out, attn_mask):
        if tensor is not None:
            grouped = tensor.reshape(rows // group, group, -1)
            if not torch.equal(grouped, grouped[:, :1].expand_as(grouped)):
                return 1
    return group


def expansion_group(new_order: Tensor, rows: int) -> int:
    """``g`` if ``new_order`` repeats each of ``rows`` sentences ``g >= 2`` times in a row (beam
    search's first reorder), else 0."""
    if rows <= 0 or new_order.numel() % rows or new_order.numel() == rows:
        return 0
    group = new_order.numel() // rows
    expected = torch.arange(rows, device=new_order.device).repeat_interleave(group)
    return group if torch.equal(new_order, expected) else 0
