"""Decoding as the paper does (§6.1) with every fairseq decoding option: GNMT length penalty,
per-sentence length limit, alignments, lexical constraints, reference scoring, option checks,
and fixes of fairseq's own decoding bugs (docs/decoding.md)."""

from .alignment import (  # noqa: F401
    GNMTSequenceGeneratorWithAlignment,
    alignment_requested,
    set_alignment_output,
)
from .constrained_search import ConstrainedBeamSearch  # noqa: F401
from .decoding_options import DecodingOptionError, check_decoding_options  # noqa: F401
from .gnmt_sequence_generator import (  # noqa: F401
    GNMTSequenceGenerator,
    SourceLengthCappedEnsemble,
    fairseq_length_penalty,
    gnmt_length_penalty,
)
from .reference_scorer import LengthPenaltyScorer  # noqa: F401
