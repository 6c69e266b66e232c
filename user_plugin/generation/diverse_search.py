"""Diverse beam search (``--diverse-beam-groups``) that works past the first batch.

fairseq's ``DiverseBeamSearch`` (Vijayakumar et al. 2016) keeps the overlap between its groups
in a ``[batch, groups, groups]`` tensor made at step 0, then indexes it with
``original_batch_idxs``, which ``SequenceGenerator`` fills with the sentences' *dataset ids*
(``sample["id"]``), not their rows in the batch: the second step of every batch but the first
failed with ``IndexError: index 32 is out of bounds for dimension 0 with size 16``.
:class:`DiverseBeamSearchByRow` translates those ids back to the rows of the first step; our
task's generator (:class:`~.gnmt_sequence_generator.GNMTSequenceGenerator`) uses it in place
of fairseq's class.
"""

from __future__ import annotations

from typing import Optional

import torch
from fairseq.search import DiverseBeamSearch
from torch import Tensor


class DiverseBeamSearchByRow(DiverseBeamSearch):
    """fairseq's diverse beam search with its group overlaps kept per row of the batch,
    whatever ids the batch's sentences have."""

    first_ids: Optional[Tensor] = None

    @classmethod
    def like(cls, search: DiverseBeamSearch, tgt_dict) -> DiverseBeamSearchByRow:
        """This search with the settings of fairseq's ``search`` (groups, strength, discount,
        candidates per group)."""
        return cls(tgt_dict, search.num_groups, -search.diversity_strength,
                   search.diversity_discount, search.candidate_multiple)

    def step(self, step: int, lprobs, scores, prev_output_tokens=None,
             original_batch_idxs=None):
        rows = self.rows_of(step, original_batch_idxs, lprobs.size(0), lprobs.device)
        return super().step(step, lprobs, scores, prev_output_tokens, rows)

    def rows_of(self, step: int, ids: Optional[Tensor], batch: int,
                device: torch.device) -> Tensor:
        """The row, in the batch of step 0, of each remaining sentence (given by its id)."""
        if step == 0 or ids is None or self.first_ids is None:
            self.first_ids = None if ids is None else ids.clone()
            return torch.arange(batch, device=device)
        return ids[:, None].eq(self.first_ids[None, :].to(ids.device)).int().argmax(dim=1)
