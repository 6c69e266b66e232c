"""Fixes of fairseq 0.12's decoding crashes outside the search itself: ``--replace-unk`` and
``fairseq-interactive --constraints`` input lines.

* **``--replace-unk`` without a file**: the flag's constant is the string ``"@@ "``, which
  ``load_align_dict`` opens as a dictionary file: ``FileNotFoundError: '@@ '``. It now means
  "no dictionary" (copy the aligned source word), as the option's help says
  (:func:`loading_no_align_dict_for_the_flag`).
* **``--replace-unk`` with alignments**: ``replace_unk`` reads ``alignment[i]`` as the source
  position of target word ``i``, but ``--print-alignment``'s hard alignments are
  ``(source word, target word)`` pairs (``TypeError: list indices must be integers or slices,
  not tuple``), and without ``--print-alignment`` fairseq's generator leaves them empty
  (``IndexError``). Pairs, per-word positions and soft alignments are now read alike; a
  ``<unk>`` without any alignment is an error that says what to add (:func:`replace_unk`).
* **An empty source under ``fairseq-interactive --constraints``**: a line ``<TAB>Hund`` lost its
  tab to ``str.strip``, so the constraint became the source and no constraint applied
  (:func:`buffered_read_keeping_fields`, read during ``fairseq_cli.interactive.main`` of our
  runs: :func:`interactive_keeping_empty_sources`); the paper's task then refuses the empty
  source.

Both ``--replace-unk`` fixes only turn fairseq's crash into a result, so they apply to every run
(``fairseq.utils`` is where ``fairseq-generate``, ``fairseq-interactive`` and
``post_process_prediction`` look them up); the input-line fix applies to our runs. The fixes of
the search itself (diverse beam search, lexically constrained search, alignments of sentences
with fewer hypotheses than the beam, ``--no-repeat-ngram-size`` on a CPU) live in our task's
generator (:mod:`user_plugin.generation`), not here; our model decoded under another task
(``--task translation``) gets them too, with that task's own scoring and length limit
(:func:`building_fixed_searches`), while a stock model keeps fairseq's generator.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Optional

from .temporary import replaced

#: The value fairseq's ``--replace-unk`` takes when given without a file name.
REPLACE_UNK_FLAG_CONSTANT = "@@ "


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
    from torch import Tensor

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
    from fairseq import tokenizer

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


def interactive_keeping_empty_sources(main):
    """``fairseq_cli.interactive.main``, during which the module reads its input with
    :func:`buffered_read_keeping_fields` instead of its ``buffered_read``."""
    module = inspect.unwrap(main).__globals__  # the command's module (``__main__`` under -m)

    @functools.wraps(main)
    def interactive_main(*args, **kwargs):
        with replaced(module, "buffered_read", buffered_read_keeping_fields):
            return main(*args, **kwargs)

    return interactive_main


def building_fixed_searches(build_generator):
    """``FairseqTask.build_generator`` that, for one of our models under another task than ours
    (the row's scope), builds our generator with fairseq's semantics: fairseq's ``|Y|^alpha``
    penalty, its ``--max-len-a/b`` limit and stopping rule, and the fixed searches (diverse beams,
    constraints, n-gram blocking, alignments of short beams) where fairseq 0.12 crashes, as
    ``--diverse-beam-groups 2`` did with ``IndexError``."""

    @functools.wraps(build_generator)
    def build(task, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
              prefix_allowed_tokens_fn=None):
        from ..generation.alignment import GNMTSequenceGeneratorWithAlignment
        from ..generation.gnmt_sequence_generator import GNMTSequenceGenerator

        alignment = getattr(args, "print_alignment", None)
        extra = dict(extra_gen_cls_kwargs or {})
        extra.update(length_penalty_form="fairseq", max_len_over_source=-1)
        if alignment:
            extra.setdefault("print_alignment", alignment)
        return build_generator(
            task, models, args,
            seq_gen_cls=GNMTSequenceGeneratorWithAlignment if alignment else GNMTSequenceGenerator,
            extra_gen_cls_kwargs=extra, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)

    return build
