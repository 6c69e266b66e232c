"""``--no-repeat-ngram-size`` on a CPU: n-grams compared with the tokens produced so far.

Without its CUDA extension, fairseq's ``NGramRepeatBlock`` compares each hypothesis' last
``n - 1`` tokens with the last ``n - 1`` entries of the whole token buffer, which are padding
until the last step: nothing was ever blocked on a CPU. :class:`NGramRepeatBlockSoFar` reads
the tokens produced so far (BOS and ``step`` tokens); our task's generator
(:class:`~.gnmt_sequence_generator.GNMTSequenceGenerator`) blocks n-grams with it.
"""

from __future__ import annotations

from fairseq.ngram_repeat_block import NGramRepeatBlock
from torch import Tensor


class NGramRepeatBlockSoFar(NGramRepeatBlock):
    """fairseq's n-gram blocking whose CPU path reads only the tokens produced so far."""

    def _no_repeat_ngram(self, tokens: Tensor, lprobs: Tensor, bsz: int, beam_size: int,
                         step: int) -> Tensor:
        return super()._no_repeat_ngram(tokens[:, : step + 1], lprobs, bsz, beam_size, step)
