"""Scoring given references (``--score-reference``) on the scale of the paper's beam search.

fairseq's ``SequenceScorer`` reports a reference's mean log-probability per token, whatever
``--lenpen``; our beam search ranks hypotheses by ``log P(Y|X) / lp(Y)`` (GNMT by default,
§6.1). :class:`LengthPenaltyScorer` gives a reference the score a hypothesis of the same
tokens would get from :class:`~.gnmt_sequence_generator.GNMTSequenceGenerator`, so that the
two can be compared; token log-probabilities and alignments are fairseq's.
"""

from __future__ import annotations

import torch
from fairseq.sequence_scorer import SequenceScorer

from .gnmt_sequence_generator import fairseq_length_penalty, gnmt_length_penalty


class LengthPenaltyScorer(SequenceScorer):
    """fairseq's reference scorer with the beam search's score: ``log P(Y|X) / lp(|Y|)``.

    Args (besides ``SequenceScorer``'s):
        length_penalty_form: ``"gnmt"`` (``((5 + |Y|) / 6) ** alpha``) or ``"fairseq"``
            (``|Y| ** alpha``); ``|Y|`` counts the EOS.
        len_penalty: alpha (``--lenpen``).
        normalize_scores: False (``--unnormalized``) reports the raw ``log P(Y|X)``.
    """

    def __init__(self, tgt_dict, length_penalty_form: str = "gnmt", len_penalty: float = 1.0,
                 normalize_scores: bool = True, **kwargs) -> None:
        super().__init__(tgt_dict, **kwargs)
        self.length_penalty_form = length_penalty_form
        self.len_penalty = len_penalty
        self.normalize_scores = normalize_scores

    def penalty(self, length: int) -> float:
        """The divisor of a reference of ``length`` tokens (EOS included)."""
        if not self.normalize_scores:
            return 1.0
        if self.length_penalty_form == "gnmt":
            return gnmt_length_penalty(length, self.len_penalty)
        return fairseq_length_penalty(length, self.len_penalty)

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        hypos = super().generate(models, sample, **kwargs)
        for sentence in hypos:
            for hypo in sentence:
                positional = hypo["positional_scores"]
                hypo["score"] = positional.sum() / self.penalty(positional.numel())
        return hypos
