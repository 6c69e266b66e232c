"""The ``vaswani_translation`` task: fairseq's ``translation`` decoding as the paper does (§6.1).

It is fairseq's ``translation`` task (same options, same data) with three changes:

* ``build_generator`` builds :class:`~user_plugin.generation.GNMTSequenceGenerator`, so that
  ``fairseq-generate``, ``fairseq-interactive``, ``--eval-bleu`` validation and
  :mod:`user_plugin.hub` rank hypotheses by ``log P(Y|X) / ((5 + |Y|) / 6) ** alpha``
  (``--lenpen`` is alpha) and cap each output at its own source length + 50 tokens.
  ``--length-penalty-form fairseq`` restores fairseq's ``|Y| ** alpha``;
  ``--max-len-over-source -1`` restores fairseq's batch-wide ``--max-len-a``/``--max-len-b``.
  Every other decoding option of fairseq applies as with its own task (docs/decoding.md):
  alignments and ``--replace-unk`` through the same beam search, references scored on its
  scale, and options that cannot apply refused in one line before decoding starts.
* No sentence is lost to batching. fairseq's ``data_utils.batch_by_size`` deletes the last batch
  when its size is not a multiple of ``--required-batch-size-multiple`` (default 8): with 100
  test sentences and ``--batch-size 64``, ``fairseq-generate`` printed 96 hypotheses. Datasets of
  this task restore that batch (see :class:`CompleteBatchesDataset`), in every split: generation,
  validation and training keep every sentence, and every batch but the last keeps the multiple.
* Validation during training never stops the run. fairseq skips training pairs longer than
  ``--max-source-positions``/``--max-target-positions`` (logging how many), but raises on such
  a pair in a validation split unless ``--skip-invalid-size-inputs-valid-test`` is given, and
  it does so at the first validation: after a whole epoch (or ``--save-interval-updates``) of
  work and before the checkpoint is written. When the training split is loaded (this process
  trains), this task skips them in every split and logs the count, per split, as a warning.
  ``fairseq-generate`` (no training split) keeps fairseq's error, raised before decoding
  starts, so that no test sentence disappears unnoticed.

The paper's settings are beam 4 and alpha 0.6: pass ``--beam 4 --lenpen 0.6`` to
``fairseq-generate`` (fairseq's own defaults are 5 and 1), or
``--eval-bleu-args '{"beam": 4, "lenpen": 0.6}'`` for validation BLEU.
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from fairseq.data import BaseWrapperDataset, FairseqDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..files.dictionaries import cut_dictionary_problem, dictionary_file_problem
from ..files.errors import UserError
from ..generation.alignment import (
    GNMTSequenceGeneratorWithAlignment,
    alignment_requested,
    set_alignment_output,
)
from ..generation.decoding_options import check_decoding_options
from ..generation.gnmt_sequence_generator import (
    LENGTH_PENALTY_FORMS,
    STOP_RULES,
    GNMTSequenceGenerator,
)
from ..generation.reference_scorer import LengthPenaltyScorer
from ..paper import MAX_LEN_OVER_SOURCE

logger = logging.getLogger(__name__)

TASK_NAME = "vaswani_translation"


@dataclass
class VaswaniTranslationConfig(TranslationConfig):
    length_penalty_form: ChoiceEnum(LENGTH_PENALTY_FORMS) = field(  # type: ignore[valid-type]
        default="gnmt",
        metadata={
            "help": "gnmt: score = log P / ((5 + |Y|) / 6) ** lenpen (the paper, §6.1); "
            "fairseq: score = log P / |Y| ** lenpen. |Y| counts the EOS."
        },
    )
    max_len_over_source: int = field(
        default=MAX_LEN_OVER_SOURCE,
        metadata={
            "help": "each output has at most its own source length (tokens, without the "
            "source EOS) + N tokens (EOS not counted; the paper: 50), within the decoder's "
            "positions; replaces --max-len-a/b. -1 uses fairseq's batch-wide "
            "--max-len-a/--max-len-b instead"
        },
    )
    stop_rule: ChoiceEnum(STOP_RULES) = field(  # type: ignore[valid-type]
        default="beam-full",
        metadata={
            "help": "beam-full: a sentence ends once --beam hypotheses have ended (fairseq's "
            "and CTranslate2's rule); no-better: once they have and no live hypothesis can "
            "still beat them (tensor2tensor's 'terminate early when possible')"
        },
    )


class CompleteBatchesDataset(BaseWrapperDataset):
    """A dataset whose batching never drops sentences.

    ``batch_by_size`` asks the wrapped dataset for its batches; if fairseq dropped a final batch
    whose size is not a multiple of ``required_batch_size_multiple``, the missing indices are
    appended as one last batch (in their original order). Everything else is the wrapped
    dataset's; unknown attributes (``src``, ``tgt``, ``src_sizes``...) are looked up there too.
    """

    def __getattr__(self, name: str):
        if name == "dataset":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def batch_by_size(
        self,
        indices,
        max_tokens=None,
        max_sentences=None,
        required_batch_size_multiple=1,
    ):
        batches = self.dataset.batch_by_size(
            indices,
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            required_batch_size_multiple=required_batch_size_multiple,
        )
        return restore_dropped_indices(indices, batches)


def restore_dropped_indices(indices, batches: list) -> list:
    """``batches`` plus one batch of the ``indices`` that no batch holds (order kept)."""
    indices = np.asarray(indices, dtype=np.int64)
    batched = sum(len(batch) for batch in batches)
    if batched >= len(indices):
        return batches
    present = (
        np.concatenate([np.asarray(batch, dtype=np.int64) for batch in batches])
        if batches
        else np.empty(0, dtype=np.int64)
    )
    missing = indices[~np.isin(indices, present)]
    if len(missing) == 0:
        return batches
    logger.info(
        "kept a final batch of %d sentences that fairseq's batch_by_size drops "
        "(its size is not a multiple of --required-batch-size-multiple)", len(missing)
    )
    return list(batches) + [missing]


@register_task(TASK_NAME, dataclass=VaswaniTranslationConfig)
class VaswaniTranslationTask(TranslationTask):
    """fairseq's ``translation`` with the paper's decoding (§6.1) and no sentence dropped."""

    cfg: VaswaniTranslationConfig

    @classmethod
    def load_dictionary(cls, filename):
        """fairseq's, after a check that names an empty or cut file."""
        problem = dictionary_file_problem(filename)
        if problem is not None:
            raise UserError(problem)
        return super().load_dictionary(filename)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        """fairseq's, then checks that the languages are those given (fairseq replaces both
        by the data directory's pair when only one is given) and that neither dictionary is a
        cut copy of the other."""
        given = (cfg.source_lang, cfg.target_lang)
        task = super().setup_task(cfg, **kwargs)
        for option, wanted, got in zip(("--source-lang", "--target-lang"), given,
                                       (cfg.source_lang, cfg.target_lang)):
            if wanted is not None and wanted != got:
                raise UserError(f"{option} {wanted} was given alone, and {cfg.data} holds "
                                f"{cfg.source_lang}-{cfg.target_lang} data: give both "
                                "--source-lang and --target-lang")
        data = str(cfg.data).split(os.pathsep)[0]
        problem = cut_dictionary_problem(
            (os.path.join(data, f"dict.{cfg.source_lang}.txt"),
             task.src_dict.symbols[task.src_dict.nspecial:]),
            (os.path.join(data, f"dict.{cfg.target_lang}.txt"),
             task.tgt_dict.symbols[task.tgt_dict.nspecial:]))
        if problem is not None:
            raise UserError(problem)
        strict_interactive_input()
        return task

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs) -> None:
        """fairseq's, after checking that every token id of the split's binarized files has an
        entry in its dictionary: files binarized with other dictionaries would otherwise end
        in an ``IndexError`` of the embedding, or be read as other words."""
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        dataset = self.datasets[split]
        for side, tokens, dictionary in (("source", dataset.src, self.src_dict),
                                         ("target", dataset.tgt, self.tgt_dict)):
            largest = largest_token_id(tokens)
            if largest is not None and largest >= len(dictionary):
                raise UserError(
                    f"{self.cfg.data}: the {split} split's {side} tokens go up to id {largest}, "
                    f"but its {side} dictionary has {len(dictionary)} entries: the files were "
                    "binarized with other dictionaries (binarize them again, or restore theirs)")
        self.datasets[split] = complete_batches(dataset)

    def filter_indices_by_size(
        self, indices, dataset, max_positions=None, ignore_invalid_inputs=False
    ):
        """fairseq's filter; while training, too-long pairs of any split are skipped, with a
        warning naming the split and the count, instead of stopping at the first validation."""
        training = self.cfg.train_subset in self.datasets
        if ignore_invalid_inputs or not training:
            return super().filter_indices_by_size(
                indices, dataset, max_positions, ignore_invalid_inputs
            )
        kept, ignored = dataset.filter_indices_by_size(indices, max_positions)
        if len(ignored) > 0:
            split = next((name for name, d in self.datasets.items() if d is dataset), "?")
            logger.warning(
                "%s: skipped %d of %d sentence pairs longer than max_positions=%s "
                "(first ids %s)", split, len(ignored), len(indices), max_positions,
                list(ignored[:10]),
            )
        return kept

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """fairseq's, after refusing a sentence with constraints and no source tokens: there
        is nothing to translate, and a text made up to hold the constraints is no translation
        (in ``fairseq-interactive --constraints`` such a line is ``<TAB>constraint``, the
        source before the first tab left out)."""
        if constraints is not None:
            refuse_constraints_without_source(src_tokens, constraints, self.target_dictionary)
        return complete_batches(
            super().build_dataset_for_inference(src_tokens, src_lengths, constraints=constraints)
        )

    def build_generator(
        self,
        models,
        args,
        seq_gen_cls=None,
        extra_gen_cls_kwargs=None,
        prefix_allowed_tokens_fn=None,
    ):
        """fairseq's generator construction, with the paper's beam search as the class.

        Options that cannot apply are refused first, in one line
        (:func:`~user_plugin.generation.decoding_options.check_decoding_options`). Decoding
        builds :class:`GNMTSequenceGenerator`, or :class:`GNMTSequenceGeneratorWithAlignment`
        when alignments are asked for (``--print-alignment``, or ``--replace-unk``, which reads
        them); ``--score-reference`` builds :class:`LengthPenaltyScorer`, which scores a
        reference as beam search scores a hypothesis. fairseq chooses the search strategy
        (sampling, diverse beams, constraints...) as for its own task.
        """
        check_decoding_options(
            args, self.datasets.values(), max_positions=decoder_positions(models),
            penalty_forms=(str(self.cfg.length_penalty_form),),
            max_len_over_source=self.cfg.max_len_over_source,
        )
        alignment = alignment_requested(args)
        if alignment:
            set_alignment_output(models, True)
        if getattr(args, "score_reference", False):
            return LengthPenaltyScorer(
                self.target_dictionary,
                length_penalty_form=str(self.cfg.length_penalty_form),
                len_penalty=getattr(args, "lenpen", 1.0),
                normalize_scores=not getattr(args, "unnormalized", False),
                compute_alignment=bool(getattr(args, "print_alignment", None)),
            )
        if seq_gen_cls is None:
            seq_gen_cls = GNMTSequenceGeneratorWithAlignment if alignment else GNMTSequenceGenerator
        extra = dict(extra_gen_cls_kwargs or {})
        if issubclass(seq_gen_cls, GNMTSequenceGeneratorWithAlignment):
            extra.setdefault("print_alignment", getattr(args, "print_alignment", None) or "hard")
        if issubclass(seq_gen_cls, GNMTSequenceGenerator):
            extra.setdefault("length_penalty_form", str(self.cfg.length_penalty_form))
            extra.setdefault("max_len_over_source", int(self.cfg.max_len_over_source))
            extra.setdefault("stop_rule", str(getattr(self.cfg, "stop_rule", "beam-full")))
        return super().build_generator(
            models,
            args,
            seq_gen_cls=seq_gen_cls,
            extra_gen_cls_kwargs=extra,
            prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        )


def refuse_constraints_without_source(src_tokens, constraints, dictionary) -> None:
    """A :class:`UserError` naming the constraints of the first sentence of ``src_tokens``
    (token tensors, EOS included) that has constraints (``constraints``, fairseq's packed form)
    but no source token."""
    from fairseq.token_generation_constraints import unpack_constraints

    for tokens, packed in zip(src_tokens, constraints):
        if int(packed[0]) > 0 and int(tokens.ne(dictionary.eos()).sum()) == 0:
            line = "<TAB>".join(["", *(dictionary.string(phrase)
                                       for phrase in unpack_constraints(packed))])
            raise UserError(
                f"--constraints: a sentence has constraints but an empty source (an input line "
                f"'{line}'): nothing to translate; give the sentence before the first tab")


def decoder_positions(models) -> Optional[int]:
    """The fewest decoder positions of ``models`` (the longest output they allow, EOS
    included), None when none says."""
    positions = [int(model.max_decoder_positions()) for model in models
                 if hasattr(model, "max_decoder_positions")]
    return min(positions) if positions else None


def complete_batches(dataset: FairseqDataset) -> FairseqDataset:
    """Wrap ``dataset`` in :class:`CompleteBatchesDataset` (once)."""
    if isinstance(dataset, CompleteBatchesDataset):
        return dataset
    return CompleteBatchesDataset(dataset)


def largest_token_id(dataset) -> int | None:
    """The largest token id in the binarized file under ``dataset`` (fairseq's memory-mapped
    format, under any of fairseq's wrappers), read from the mapped file at once; None for
    another format (text read through the dictionary holds only its ids) or no dataset."""
    inner = dataset
    while inner is not None and getattr(inner, "_bin_buffer", None) is None:
        inner = getattr(inner, "dataset", None)
    if inner is None:
        return None
    tokens = np.frombuffer(inner._bin_buffer, dtype=inner._index.dtype)
    return int(tokens.max()) if tokens.size else None


def strict_interactive_input() -> None:
    """In ``fairseq-interactive``, standard input decoded strictly as UTF-8: Python reads it
    with ``surrogateescape`` under a C or UTF-8 locale, so a byte that is no UTF-8 would
    become an unknown word and the line be translated without a word said; strict, reading
    it is one error line (:mod:`user_plugin.fairseq_patches.one_line_errors`). Other
    processes read their input themselves (``vaswani-translate`` refuses such lines with
    their number)."""
    import io
    import sys

    main = getattr(sys.modules.get("__main__"), "__spec__", None)  # python -m fairseq_cli...
    interactive = "fairseq_cli.interactive" in (*sys.modules, getattr(main, "name", None))
    if interactive and isinstance(sys.stdin, io.TextIOWrapper) and sys.stdin.errors != "strict":
        try:
            sys.stdin.reconfigure(encoding="utf-8", errors="strict")
        except (ValueError, io.UnsupportedOperation):  # already read from: left as it is
            pass
