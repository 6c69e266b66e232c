"""Lexically constrained decoding (``--constraints``) under the paper's output limit (§6.1).

fairseq's ``LexicallyConstrainedBeamSearch`` (Post & Vilar 2018; Hu et al. 2019) keeps, for
every hypothesis, which constraint tokens it has produced, forbids EOS until all are, and fills
the beam round-robin across "banks" (hypotheses grouped by constraint progress). Under a
maximum output length this fails: a hypothesis at its limit may only end, while the search
forbids it to end before its constraints are met, so it has no finite continuation left; when
no hypothesis of a sentence can finish, fairseq stops with ``AssertionError: 60 < 60`` (the
measured failure with ``--task vaswani_translation``, whose per-sentence limit, source + 50,
is what the hypotheses ran into). Two changes make the two compose:

* **Constraints are met by the limit.** A hypothesis with exactly as many tokens left before its
  limit as its unmet constraints still need may only continue with the tokens that advance them
  (:func:`advancing_tokens`; :class:`~.gnmt_sequence_generator.SourceLengthCappedEnsemble`
  applies it), so it reaches its limit with every constraint in place, and then ends. A
  sentence's limit is its source + N, or its constraints' length if that is more.
* **A dead candidate never takes a live one's place.** The round-robin allocation takes the best
  candidate of each bank even when its score is ``-inf`` (all of its continuations forbidden),
  pushing finite candidates out of the beam; such a hypothesis can never finish.
  :class:`ConstrainedBeamSearch` ranks ``-inf`` candidates after every finite one, keeping
  fairseq's order otherwise, and records which sentences have no live candidate left
  (:attr:`ConstrainedBeamSearch.exhausted`): when constraints leave fewer paths than the beam
  holds, such a sentence ends with the hypotheses it has (the generator's ``is_finished``)
  instead of waiting for hypotheses that can never come.
"""

from __future__ import annotations

import math

import torch
from fairseq.search import LexicallyConstrainedBeamSearch
from fairseq.token_generation_constraints import (
    ConstraintState,
    OrderedConstraintState,
    unpack_constraints,
)
from torch import Tensor


def total_tokens(state: ConstraintState) -> int:
    """How many tokens all of a hypothesis' constraints hold together (fairseq's
    ``num_constraint_tokens`` fails on ordered constraints: its sequence has no
    ``token_counts``)."""
    if isinstance(state, OrderedConstraintState):
        return len(state.sequence)
    return state.num_constraint_tokens


def tokens_to_go(state: ConstraintState) -> int:
    """How many constraint tokens a hypothesis still has to produce (0 once all are met)."""
    if state.finished:
        return 0
    return max(0, total_tokens(state) - state.bank)


def advancing_tokens(state: ConstraintState) -> list[int]:
    """The tokens after which the hypothesis has produced one more constraint token."""
    return [token for token in state.next_tokens() if state.advance(token).bank > state.bank]


def constraint_lengths(constraints: Tensor) -> Tensor:
    """Total constraint tokens of each sentence of a packed constraints tensor ``[B, L]``."""
    return torch.tensor(
        [sum(c.numel() for c in unpack_constraints(row)) for row in constraints.cpu()],
        dtype=torch.long,
    )


class ConstrainedBeamSearch(LexicallyConstrainedBeamSearch):
    """fairseq's lexically constrained beam search, where candidates scored ``-inf`` come after
    every finite candidate of their sentence, and constraints are required.

    After each step, ``exhausted[i]`` says that sentence ``i`` of the batch has no finite
    candidate but EOS: once those end, nothing of it can be continued."""

    exhausted: Tensor | None = None

    def step(self, step: int, lprobs: Tensor, scores, prev_output_tokens=None,
             original_batch_idxs=None):
        cand_scores, cand_indices, cand_beams = super().step(
            step, lprobs, scores, prev_output_tokens, original_batch_idxs
        )
        live = cand_scores.ne(-math.inf) & cand_indices.ne(self.eos)
        self.exhausted = ~live.any(dim=1)
        return cand_scores, cand_indices, cand_beams

    def init_constraints(self, batch_constraints, beam_size: int) -> None:
        if batch_constraints is None:
            raise ValueError(
                "--constraints: this input carries no constraints (they come with "
                "fairseq-interactive's input lines, 'source<TAB>constraint<TAB>...')"
            )
        super().init_constraints(batch_constraints, beam_size)

    def step_sentence(self, step: int, sentno: int, lprobs: Tensor, constraint_states,
                      beams_buf: Tensor, indices_buf: Tensor, scores_buf: Tensor):
        keep = self.num_cands
        self.num_cands = beams_buf.numel() + sum(
            len(state.next_tokens()) for state in constraint_states
        )
        try:
            scores, indices, beams, states = super().step_sentence(
                step, sentno, lprobs, constraint_states, beams_buf, indices_buf, scores_buf
            )
        finally:
            self.num_cands = keep
        finite = scores.ne(-math.inf)
        order = torch.cat([finite.nonzero().view(-1), (~finite).nonzero().view(-1)])[:keep]
        return (scores[order], indices[order], beams[order],
                [states[i] for i in order.tolist()])
