"""Which of fairseq's decoding options can apply, checked before any decoding starts.

fairseq checks some combinations itself (``--sampling`` needs ``--nbest`` = ``--beam``,
exclusive search strategies) and leaves others to fail in the middle of decoding with an
unrelated error: ``--beam 0`` ends in a reshape error of the first step, a
``--diverse-beam-groups`` that does not divide ``--beam`` fails at the first step,
``fairseq-generate --constraints`` fails with ``'NoneType' object is not iterable`` on the first
batch (binarized data carries no constraints). :func:`check_decoding_options` refuses each of
them with one :class:`DecodingOptionError` line naming the option, when the generator is built.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..files.errors import UserError


class DecodingOptionError(UserError, ValueError):
    """A decoding option, or combination, that cannot apply: one line naming the option."""


def check_decoding_options(args, datasets: Iterable = ()) -> None:
    """Refuse options that cannot apply (see the module docstring).

    ``args`` is a generation configuration (``cfg.generation``, or any object with fairseq's
    option names); ``datasets`` are the splits the task has loaded from disk, whose pairs
    carry no constraints (``fairseq-interactive`` builds its batches, constraints included,
    after the generator).
    """
    beam = getattr(args, "beam", 5)
    if beam < 1:
        raise DecodingOptionError(f"--beam must be at least 1, got {beam}")
    nbest = getattr(args, "nbest", 1)
    if not 1 <= nbest <= beam:
        raise DecodingOptionError(
            f"--nbest must be between 1 and --beam {beam} (the hypotheses a search keeps), "
            f"got {nbest}"
        )
    temperature = getattr(args, "temperature", 1.0)
    if temperature <= 0:
        raise DecodingOptionError(f"--temperature must be greater than 0, got {temperature}")
    groups = getattr(args, "diverse_beam_groups", -1)
    if groups > 0 and beam % groups:
        raise DecodingOptionError(
            f"--diverse-beam-groups {groups} must divide --beam {beam} (each group holds "
            "the same number of hypotheses)"
        )
    if getattr(args, "constraints", None) and any(
        getattr(dataset, "constraints", None) is None for dataset in datasets
    ):
        raise DecodingOptionError(
            "--constraints: binarized data carries no constraints; give them to "
            "fairseq-interactive as 'source<TAB>constraint<TAB>...' lines"
        )
