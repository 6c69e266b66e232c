"""Beam search as the paper decodes (§6.1): GNMT length penalty, per-sentence length limit."""

from .gnmt_sequence_generator import (  # noqa: F401
    GNMTSequenceGenerator,
    SourceLengthCappedEnsemble,
    fairseq_length_penalty,
    gnmt_length_penalty,
)
