"""Fixes of fairseq 0.12's decoding bugs, installed when the plugin is imported.

They are installed in fairseq's modules (not only in our task), because the bugs hit fairseq's
own ``translation`` task and its own ``transformer`` as well, and a command line should behave
the same whichever task or architecture it names. Each fix keeps fairseq's results wherever
fairseq did not fail.

* **Diverse beam search** (``--diverse-beam-groups``) crashed with ``IndexError: index 32 is out
  of bounds for dimension 0 with size 16`` on the second step of every batch but the first.
  ``DiverseBeamSearch`` keeps its group overlaps in a ``[batch, groups, groups]`` tensor made
  at step 0, then indexes it with ``original_batch_idxs``, which ``SequenceGenerator`` fills
  with the sentences' *dataset ids* (``sample["id"]``), not their rows in the batch.
  :class:`DiverseBeamSearchByRow` translates those ids back to the rows of the first step.
* **``--replace-unk`` without a file**: the flag's constant is the string ``"@@ "``, which
  ``load_align_dict`` opens as a dictionary file: ``FileNotFoundError: '@@ '``. It now means
  "no dictionary" (copy the aligned source word), as the option's help says.
* **``--replace-unk`` with alignments**: ``replace_unk`` reads ``alignment[i]`` as the source
  position of target word ``i``, but ``--print-alignment``'s hard alignments are
  ``(source word, target word)`` pairs (``TypeError: list indices must be integers or slices,
  not tuple``), and without ``--print-alignment`` fairseq's generator leaves them empty
  (``IndexError``). Pairs, per-word positions and soft alignments are now read alike; a
  ``<unk>`` without any alignment is an error that says what to add.
* **Alignments of fewer than ``--beam`` hypotheses**: ``SequenceGeneratorWithAlignment`` reads
  hypothesis ``i % beam`` of every sentence, but a sentence can end with fewer (lexically
  constrained decoding that reaches its maximum length): ``IndexError: list index out of
  range``. It now aligns the hypotheses there are (:func:`~.alignment.add_alignments`).
* **Lexically constrained decoding** gave beam slots to hypotheses scored ``-inf``, which can
  never finish, ahead of live ones (:class:`~.constrained_search.ConstrainedBeamSearch`).
* **``--no-repeat-ngram-size`` did nothing on a CPU**: without the CUDA extension,
  ``NGramRepeatBlock`` compares each hypothesis' n-grams with the last ``n - 1`` entries of the
  whole token buffer, which are padding until the last step, so nothing was ever blocked. It
  now reads the tokens produced so far (:func:`blocking_repeated_ngrams_so_far`).

:mod:`user_plugin.fairseq_patches` installs them: ``DiverseBeamSearch`` and
``LexicallyConstrainedBeamSearch`` in ``fairseq.search`` (where ``FairseqTask.build_generator``
looks them up), ``SequenceGeneratorWithAlignment.generate``, ``load_align_dict`` and
``replace_unk`` in ``fairseq.utils`` (looked up there by ``fairseq-generate``,
``fairseq-interactive`` and ``post_process_prediction``), and the CPU path of
``NGramRepeatBlock``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Optional

import torch
from fairseq import search, tokenizer
from torch import Tensor

from .alignment import add_alignments

#: The value fairseq's ``--replace-unk`` takes when given without a file name.
REPLACE_UNK_FLAG_CONSTANT = "@@ "


class DiverseBeamSearchByRow(search.DiverseBeamSearch):
    """fairseq's diverse beam search (Vijayakumar et al. 2016) with its group overlaps kept per
    row of the batch, whatever ids the batch's sentences have."""

    first_ids: Optional[Tensor] = None

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


def loading_no_align_dict_for_the_flag(load_align_dict):
    """fairseq's ``load_align_dict``, where the bare flag's constant means no dictionary."""

    @functools.wraps(load_align_dict)
    def load(replace_unk: Optional[str]) -> Optional[dict]:
        if replace_unk == REPLACE_UNK_FLAG_CONSTANT:
            return {}
        return load_align_dict(replace_unk)

    return load


def source_positions(alignment) -> dict:
    """Target word index -> aligned source position, from any alignment fairseq produces:
    hard ``(source, target)`` pairs (the first pair of a target word wins), soft rows of
    scores (the highest), or one source position per target word (tensor or list)."""
    if alignment is None or len(alignment) == 0:
        return {}
    if isinstance(alignment, Tensor):
        return {i: int(source) for i, source in enumerate(alignment.tolist())}
    first = alignment[0]
    if isinstance(first, Sequence) and not isinstance(first, str) and len(first) == 2 and all(
        isinstance(v, int) for v in first
    ):
        positions: dict = {}
        for source, target in alignment:
            positions.setdefault(int(target), int(source))
        return positions
    if isinstance(first, Sequence) and not isinstance(first, str):
        return {i: max(range(len(row)), key=lambda j, row=row: float(row[j]))
                for i, row in enumerate(alignment)}
    return {i: int(source) for i, source in enumerate(alignment)}


def replace_unk(hypo_str: str, src_str: str, alignment, align_dict: Mapping, unk: str) -> str:
    """Replace each ``unk`` of ``hypo_str`` by its aligned source word, translated by
    ``align_dict`` when listed there (fairseq's rule, for every alignment format)."""
    hypo_tokens = tokenizer.tokenize_line(hypo_str)
    src_tokens = tokenizer.tokenize_line(src_str) + ["<eos>"]
    positions = source_positions(alignment)
    for i, token in enumerate(hypo_tokens):
        if token != unk:
            continue
        if i not in positions:
            raise ValueError(
                "--replace-unk: the hypothesis has no alignment for its <unk> (under "
                "--task translation add --print-alignment, or use --task vaswani_translation)"
            )
        source = src_tokens[min(positions[i], len(src_tokens) - 1)]
        hypo_tokens[i] = align_dict.get(source, source)
    return " ".join(hypo_tokens)


@torch.no_grad()
def generate_with_alignments(self, models, sample, **kwargs):
    """``SequenceGeneratorWithAlignment.generate``: search, then align every hypothesis."""
    return add_alignments(self, sample, self._generate(sample, **kwargs))


def blocking_repeated_ngrams_so_far(no_repeat_ngram):
    """``NGramRepeatBlock``'s CPU path (``no_repeat_ngram``) on the tokens produced so far (BOS
    and ``step`` tokens) instead of the whole, mostly padded, buffer."""

    @functools.wraps(no_repeat_ngram)
    def block_repeated_ngrams(self, tokens: Tensor, lprobs: Tensor, bsz: int, beam_size: int,
                              step: int) -> Tensor:
        return no_repeat_ngram(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)

    return block_repeated_ngrams


def strip_keeping_an_empty_source(line: str) -> str:
    """``line`` without its line end and surrounding whitespace, but with a leading tab kept:
    under ``--constraints`` a line is ``source<TAB>constraint...``, and a line starting with
    a tab has an empty source (fairseq's ``str.strip`` made its first constraint the source)."""
    stripped = line.rstrip()
    start = len(stripped) - len(stripped.lstrip())
    tab = stripped.find("\t", 0, start)
    return stripped[tab:] if tab >= 0 else stripped[start:]


def buffered_read_keeping_fields(input, buffer_size):
    """``fairseq_cli.interactive.buffered_read``: the lines of ``input`` (a file, or ``-`` for
    standard input) in lists of ``buffer_size``, each stripped by
    :func:`strip_keeping_an_empty_source` instead of ``str.strip``."""
    import fileinput

    buffer = []
    with fileinput.input(files=[input], openhook=fileinput.hook_encoded("utf-8")) as lines:
        for line in lines:
            buffer.append(strip_keeping_an_empty_source(line))
            if len(buffer) >= buffer_size:
                yield buffer
                buffer = []
    if buffer:
        yield buffer
