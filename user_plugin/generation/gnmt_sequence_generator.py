"""Beam search as the paper decodes (§6.1): GNMT length penalty and a per-sentence length limit.

The paper: "beam search with a beam size of 4 and length penalty alpha = 0.6 (Wu et al. 2016)
[...] We set the maximum output length during inference to input length + 50, but terminate
early when possible."

* **Length penalty.** GNMT (Wu et al. 2016, eq. 14) ranks a finished hypothesis Y by
  ``log P(Y|X) / lp(Y)`` with ``lp(Y) = ((5 + |Y|) / 6) ** alpha``. fairseq's ``--lenpen alpha``
  divides by ``|Y| ** alpha`` instead. ``|Y|`` counts the final EOS in both cases: it is the number
  of positional scores that ``fairseq-generate`` prints on the ``P-`` line.
* **Maximum output length.** Each sentence of a batch may produce at most *its own* source
  length + N tokens (EOS not counted), where the source length counts the source tokens after
  BPE *without* the source EOS and padding. fairseq's ``--max-len-a 1 --max-len-b 50`` instead
  uses the padded width of the whole batch, so the limit of a short sentence depends on the
  longest sentence batched with it.
* **Early termination.** Two rules (``stop_rule``). ``beam-full`` (the default, fairseq's and
  CTranslate2's): a sentence stops as soon as ``beam`` hypotheses have ended in EOS.
  ``no-better`` (tensor2tensor's, which the paper's "terminate early when possible" refers to):
  it stops only once ``beam`` hypotheses have ended *and* no live hypothesis can still beat the
  worst of them; a live hypothesis can at best keep its log-probability so far and reach the
  largest penalty its remaining length allows. Later hypotheses that score better replace
  worse finished ones. ``beam-full`` can end a sentence on early, short hypotheses while a
  better one is still alive; the difference shows with large beams over small vocabularies
  (the parsing recipe's beam 21 over 40 symbols), where early EOS candidates fill the beam.
* **fairseq's search parts, fixed.** Lexically constrained search, diverse beam search and
  ``--no-repeat-ngram-size`` on a CPU fail or do nothing in fairseq 0.12; this generator
  decodes with fixed versions of them (:func:`our_search`, :mod:`.diverse_search`,
  :mod:`.ngram_blocking`), so every decoding option of ``--task vaswani_translation`` works.
* **Forced tokens.** Tokens the user forces into the output, lexical constraints
  (``--constraints``) or a prefix (``--prefix-size``), are always given room: a sentence's
  limit is its source + N or the number of forced tokens, whichever is more, and a hypothesis
  whose unmet constraints need all the room it has left may only advance them
  (:mod:`.constrained_search`), so that it meets them before it has to end.

Only ``finalize_hypos`` of fairseq's ``SequenceGenerator`` reads the length penalty, and all the
hypotheses it finalizes in one call have the same length, so the GNMT form is applied there.
The per-sentence limit lives in :class:`SourceLengthCappedEnsemble`, which follows the beam
reordering of the encoder output and forces EOS on rows that reached their limit.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence

import torch
from fairseq.search import DiverseBeamSearch, LexicallyConstrainedBeamSearch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from torch import Tensor

from ..paper import MAX_LEN_OVER_SOURCE
from .constrained_search import (
    ConstrainedBeamSearch,
    advancing_tokens,
    constraint_lengths,
    tokens_to_go,
    total_tokens,
)
from .diverse_search import DiverseBeamSearchByRow
from .ngram_blocking import NGramRepeatBlockSoFar

logger = logging.getLogger(__name__)

LENGTH_PENALTY_FORMS = ("gnmt", "fairseq")
STOP_RULES = ("beam-full", "no-better")


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016), ``length`` = |Y| with EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def fairseq_length_penalty(length: int, alpha: float) -> float:
    """fairseq's ``--lenpen``: ``|Y| ** alpha``."""
    return float(length) ** alpha


def penalty_function(form: str):
    """The length penalty of ``form`` (one of :data:`LENGTH_PENALTY_FORMS`)."""
    if form not in LENGTH_PENALTY_FORMS:
        raise ValueError(f"length_penalty_form must be one of {LENGTH_PENALTY_FORMS}, "
                         f"got {form!r}")
    return gnmt_length_penalty if form == "gnmt" else fairseq_length_penalty


def output_limit(source_tokens, max_len_over_source: int, max_positions: int | None,
                 min_len: int = 1):
    """The most tokens an output may hold before its EOS, the one definition both backends
    of the hub (and fairseq's command lines under our task) decode by.

    The paper's limit (§6.1) is the source length (tokens after subwords, without the source
    EOS) + ``max_len_over_source``; it is at least ``min_len`` (the shortest output allowed)
    and at most ``max_positions - 1``: the decoder reads BOS and every output token but the
    last, so ``max_positions - 1`` tokens and their EOS fill its positions (fairseq's
    ``SequenceGenerator`` caps its ``max_len`` there too). The EOS comes after the limit's
    tokens: an output at the limit holds ``limit + 1`` tokens with EOS. ``source_tokens`` is
    an int, or a tensor of per-sentence counts (then so is the result); ``max_positions``
    None means no cap.
    """
    if isinstance(source_tokens, Tensor):
        limit = (source_tokens + max_len_over_source).clamp(min=min_len)
        return limit if max_positions is None else limit.clamp(max=max_positions - 1)
    limit = max(int(source_tokens) + max_len_over_source, min_len)
    return limit if max_positions is None else min(limit, max_positions - 1)


def source_lengths_without_eos(src_tokens: Tensor, pad: int, eos: int) -> Tensor:
    """Number of real source tokens per row: neither padding nor EOS."""
    return (src_tokens.ne(pad) & src_tokens.ne(eos)).long().sum(dim=1)


class SourceLengthCappedEnsemble(EnsembleModel):
    """fairseq's model ensemble with a per-sentence maximum output length (paper §6.1).

    ``forward_encoder`` computes each sentence's limit,
    ``source tokens (no EOS) + max_len_over_source`` (at least ``min_output_len`` and the
    sentence's ``forced_lengths``); every ``reorder_encoder_out`` applies the same row selection
    to the limits, so row ``r`` of the decoder input always meets its own sentence's limit; and
    ``forward_decoder`` leaves only EOS possible (with its model log-probability, so the scores
    stay true log-probabilities) on rows whose output already holds that many tokens. With a
    ``constraint_search``, a row whose unmet constraints need all its remaining room may only
    continue with tokens that advance them.
    """

    def __init__(self, models: Sequence[torch.nn.Module], max_len_over_source: int) -> None:
        super().__init__(list(models))
        if max_len_over_source < 0:
            raise ValueError(f"max_len_over_source must be >= 0, got {max_len_over_source}")
        self.max_len_over_source = max_len_over_source
        self.min_output_len = 1
        encoder_dict = getattr(self.single_model.encoder, "dictionary", None)
        decoder_dict = self.single_model.decoder.dictionary
        source_dict = encoder_dict if encoder_dict is not None else decoder_dict
        self.source_pad, self.source_eos = source_dict.pad(), source_dict.eos()
        self.eos = decoder_dict.eos()
        self.row_limits: Tensor | None = None
        # Set per batch by the generator: tokens forced into each sentence's output.
        self.forced_lengths: Tensor | None = None
        # The constrained search whose per-hypothesis states follow the decoder's rows.
        self.constraint_search: LexicallyConstrainedBeamSearch | None = None

    def output_limits(self, src_tokens: Tensor, max_positions: int | None = None) -> Tensor:
        """The maximum number of output tokens (EOS excluded) of each source row
        (:func:`output_limit`), at least its forced tokens, within ``max_positions``."""
        lengths = source_lengths_without_eos(src_tokens, self.source_pad, self.source_eos)
        limits = output_limit(lengths, self.max_len_over_source, None, self.min_output_len)
        if self.forced_lengths is not None:
            limits = torch.maximum(limits, self.forced_lengths.to(limits.device))
        return limits if max_positions is None else limits.clamp(max=max_positions - 1)

    def forward_encoder(self, net_input: dict[str, Tensor]):
        positions = self.max_decoder_positions()
        uncapped = self.output_limits(net_input["src_tokens"])
        self.row_limits = uncapped.clamp(max=positions - 1)
        longest = int(uncapped.max()) if uncapped.numel() else 0
        if longest > positions - 1:
            logger.warning(
                "per-sentence output limit %d exceeds what the decoder positions allow (%d): "
                "the model's --max-target-positions binds for the longest sentences",
                longest, positions - 1,
            )
        return super().forward_encoder(net_input)

    def reorder_encoder_out(self, encoder_outs, new_order):
        if self.row_limits is not None:
            self.row_limits = self.row_limits.index_select(0, new_order.to(self.row_limits.device))
        return super().reorder_encoder_out(encoder_outs, new_order)

    def forward_decoder(self, tokens, encoder_outs, incremental_states, temperature: float = 1.0):
        lprobs, attn = super().forward_decoder(
            tokens, encoder_outs, incremental_states, temperature
        )
        if self.row_limits is not None:
            produced = tokens.size(1) - 1  # column 0 is the BOS (EOS) marker
            room = self.row_limits - produced  # tokens each row may still output
            at_limit = room.le(0) & ~self.advance_constraints(lprobs, room)
            if bool(at_limit.any()):
                eos_lprobs = lprobs[at_limit, self.eos].clone()
                lprobs[at_limit] = -math.inf
                lprobs[at_limit, self.eos] = eos_lprobs
        return lprobs, attn

    def advance_constraints(self, lprobs: Tensor, room: Tensor) -> Tensor:
        """On rows whose unmet constraints need all their ``room``, leave only the tokens that
        advance them (in place); returns which rows that was."""
        forced = torch.zeros_like(room, dtype=torch.bool)
        search = self.constraint_search
        states = getattr(search, "constraint_states", None) if search is not None else None
        if not states:
            return forced
        group = len(states[0])
        longest = max(total_tokens(sentence[0]) for sentence in states)
        left = room.tolist()
        for row in room.le(longest).nonzero().view(-1).tolist():
            state = states[row // group][row % group]
            advancing = advancing_tokens(state) if 0 < tokens_to_go(state) >= left[row] else []
            if advancing:
                allowed = torch.tensor(advancing, dtype=torch.long, device=lprobs.device)
                kept = lprobs[row, allowed].clone()
                lprobs[row] = -math.inf
                lprobs[row, allowed] = kept
                forced[row] = True
        return forced


def our_search(search, tgt_dict):
    """The search strategy our generator decodes with in place of fairseq's ``search`` (which
    ``FairseqTask.build_generator`` chose from the options): lexically constrained search
    (:class:`~.constrained_search.ConstrainedBeamSearch`) and diverse beam search
    (:class:`~.diverse_search.DiverseBeamSearchByRow`) as fixed here; any other as it is."""
    if type(search) is LexicallyConstrainedBeamSearch:
        return ConstrainedBeamSearch(tgt_dict, search.representation)
    if type(search) is DiverseBeamSearch:
        return DiverseBeamSearchByRow.like(search, tgt_dict)
    return search


class GNMTSequenceGenerator(SequenceGenerator):
    """fairseq's beam search with the paper's length penalty and length limit (§6.1).

    Args (besides ``SequenceGenerator``'s; ``len_penalty`` is alpha in both forms):
        length_penalty_form: ``"gnmt"`` divides by ``((5 + |Y|) / 6) ** alpha`` (the paper);
            ``"fairseq"`` by ``|Y| ** alpha`` (fairseq's ``--lenpen``).
        max_len_over_source: ``N >= 0``: each sentence outputs at most its own source length
            (tokens, no EOS) + N tokens (:func:`output_limit`); the batch-wide
            ``max_len_a``/``max_len_b`` are then set to ``1``/``max(N, min_len)`` (padded width
            + N), which never binds below any sentence's own limit.
            ``N < 0`` turns the per-sentence limit off and keeps fairseq's ``max_len_a``/``b``.
        stop_rule: ``"beam-full"`` (fairseq's) or ``"no-better"`` (tensor2tensor's); see the
            module's docstring.
    """

    def __init__(
        self,
        models,
        tgt_dict,
        length_penalty_form: str = "gnmt",
        max_len_over_source: int = MAX_LEN_OVER_SOURCE,
        stop_rule: str = "beam-full",
        **kwargs,
    ) -> None:
        if length_penalty_form not in LENGTH_PENALTY_FORMS:
            raise ValueError(
                f"length_penalty_form must be one of {LENGTH_PENALTY_FORMS}, "
                f"got {length_penalty_form!r}"
            )
        if stop_rule not in STOP_RULES:
            raise ValueError(f"stop_rule must be one of {STOP_RULES}, got {stop_rule!r}")
        self.stop_rule = stop_rule
        # False while fairseq's finalize_hypos runs under the no-better rule, which decides
        # itself which sentences end.
        self.fairseq_decides = True
        if max_len_over_source >= 0:
            if isinstance(models, EnsembleModel) and not isinstance(
                models, SourceLengthCappedEnsemble
            ):
                raise ValueError("a per-sentence length limit needs a list of models")
            if not isinstance(models, EnsembleModel):
                models = SourceLengthCappedEnsemble(models, max_len_over_source)
        kwargs["search_strategy"] = our_search(kwargs.get("search_strategy"), tgt_dict)
        super().__init__(models, tgt_dict, **kwargs)
        if self.repeat_ngram_blocker is not None:
            self.repeat_ngram_blocker = NGramRepeatBlockSoFar(
                self.repeat_ngram_blocker.no_repeat_ngram_size)
        if isinstance(self.model, SourceLengthCappedEnsemble) and self.search.supports_constraints:
            self.model.constraint_search = self.search
        self.length_penalty_form = length_penalty_form
        self.max_len_over_source = max_len_over_source
        # The GNMT normalization is applied here (finalize_hypos), not by fairseq's code.
        self.gnmt_normalize = self.normalize_scores and length_penalty_form == "gnmt"
        if self.gnmt_normalize:
            self.normalize_scores = False
        if max_len_over_source >= 0:
            self.model.min_output_len = self.min_len
            self.model.eos = self.eos
            logger.info(
                "maximum output length: each sentence's source length (tokens, without EOS) + "
                "%d; batch-wide cap set to max_len_a=1, max_len_b=%d (was %s, %s) so that it "
                "never binds first", max_len_over_source, max_len_over_source,
                self.max_len_a, self.max_len_b,
            )
            # the batch-wide cap never binds below a sentence's limit, --min-len included
            self.max_len_a, self.max_len_b = 1, max(max_len_over_source, self.min_len)

    def _generate(self, sample, prefix_tokens: Tensor | None = None,
                  constraints: Tensor | None = None, bos_token: int | None = None):
        """fairseq's search; with a per-sentence limit, each sentence's forced tokens
        (constraints, prefix) are counted so that its limit leaves room for them."""
        if not isinstance(self.model, SourceLengthCappedEnsemble):
            return super()._generate(sample, prefix_tokens, constraints, bos_token)
        forced = forced_lengths(prefix_tokens, constraints, self.pad)
        self.model.forced_lengths = forced
        batch_cap = self.max_len_b
        if forced is not None:
            # the batch-wide cap (padded width + N) must not bind below a forced limit
            self.max_len_b = max(batch_cap, int(forced.max()))
        try:
            return super()._generate(sample, prefix_tokens, constraints, bos_token)
        finally:
            self.max_len_b = batch_cap
            self.model.forced_lengths = None

    def is_finished(self, step: int, unfin_idx: int, max_len: int, finalized_sent_len: int,
                    beam_size: int) -> bool:
        """fairseq's rule (``beam`` hypotheses, or the maximum length), or a sentence whose
        constrained search has nothing left to continue (fewer paths than the beam)."""
        if not self.fairseq_decides:
            return False
        if super().is_finished(step, unfin_idx, max_len, finalized_sent_len, beam_size):
            return True
        exhausted = getattr(self.search, "exhausted", None)
        return exhausted is not None and bool(exhausted[unfin_idx])

    #: Per sentence of the batch being decoded (in the batch's order), its own alpha; None:
    #: ``len_penalty`` for every sentence. Set around one ``generate`` call
    #: (:meth:`sentence_alphas`), so that requests asking for different penalties decode in
    #: one batch: the penalty only divides finished hypotheses' scores, so each sentence's
    #: result is that of a batch decoded with its alpha alone.
    sentence_len_penalties: Sequence[float] | None = None

    @contextlib.contextmanager
    def sentence_alphas(self, alphas: Sequence[float]):
        """Decode the next batch with alpha ``alphas[i]`` for its sentence ``i`` (the GNMT form
        only: fairseq's form is applied inside fairseq's code, with one alpha)."""
        if not self.gnmt_normalize and len(set(alphas)) > 1:
            raise ValueError("one length penalty per batch with --length-penalty fairseq")
        self.sentence_len_penalties = list(alphas)
        try:
            yield self
        finally:
            self.sentence_len_penalties = None

    def alpha(self, sent: int) -> float:
        """The alpha of sentence ``sent`` of the batch being decoded."""
        alphas = self.sentence_len_penalties
        return self.len_penalty if alphas is None else alphas[sent]

    def length_penalty(self, length: int, sent: int = 0) -> float:
        """The divisor of ``log P(Y|X)`` for a finished hypothesis of ``length`` tokens (+EOS)
        of sentence ``sent``."""
        if self.length_penalty_form == "gnmt":
            return gnmt_length_penalty(length, self.alpha(sent))
        return fairseq_length_penalty(length, self.alpha(sent))

    def finalize_hypos(
        self,
        step: int,
        bbsz_idx,
        eos_scores,
        tokens,
        scores,
        finalized: list[list[dict[str, Tensor]]],
        finished: list[bool],
        beam_size: int,
        attn: Tensor | None,
        src_lengths,
        max_len: int,
    ):
        """Finalize as fairseq does, then divide the new hypotheses' scores by the GNMT lp.

        With ``normalize_scores`` switched off for fairseq's code, the stored ``score`` is the
        raw ``log P(Y|X)`` (and the positional scores are untouched); every hypothesis
        finalized in this call has ``|Y| = step + 1`` tokens including EOS.
        """
        if self.stop_rule == "no-better":
            return self.finalize_unless_better_alive(
                step, bbsz_idx, eos_scores, tokens, scores, finalized, finished, beam_size,
                attn, src_lengths, max_len,
            )
        before = [len(hypos) for hypos in finalized]
        newly_finished = super().finalize_hypos(
            step, bbsz_idx, eos_scores, tokens, scores, finalized, finished, beam_size, attn,
            src_lengths, max_len,
        )
        self.normalize_new(finalized, before, step)
        return newly_finished

    def normalize_new(self, finalized: list[list[dict]], before: Sequence[int], step: int) -> None:
        """Divide the scores of the hypotheses finalized at ``step`` (those past ``before``)
        by the GNMT penalty of their length, ``step + 1`` with EOS."""
        if self.gnmt_normalize:
            for sent, count in enumerate(before):
                divisor = gnmt_length_penalty(step + 1, self.alpha(sent))
                for hypo in finalized[sent][count:]:
                    hypo["score"] = hypo["score"] / divisor

    def finalize_unless_better_alive(
        self, step: int, bbsz_idx, eos_scores, tokens, scores,
        finalized: list[list[dict[str, Tensor]]], finished: list[bool], beam_size: int,
        attn: Tensor | None, src_lengths, max_len: int,
    ) -> list[int]:
        """The ``no-better`` rule. fairseq's code builds the new hypotheses into empty lists
        (so it keeps them all and ends no sentence); each sentence then keeps its best
        ``beam`` finished hypotheses, and ends when it reached its length limit or when the
        best a live hypothesis could still score, its log-probability so far (the best row's
        cumulative score before this step) over the largest penalty left to it, is no better
        than the worst of those ``beam``."""
        fresh: list[list[dict[str, Tensor]]] = [[] for _ in finalized]
        self.fairseq_decides = False
        try:
            super().finalize_hypos(step, bbsz_idx, eos_scores, tokens, scores, fresh, finished,
                                   beam_size, attn, src_lengths, max_len)
        finally:
            self.fairseq_decides = True
        self.normalize_new(fresh, [0] * len(fresh), step)
        unfinished = [sent for sent, done in enumerate(finished) if not done]
        rows = scores.view(-1, beam_size, scores.size(-1))
        newly_finished = []
        for unfin_idx, sent in enumerate(unfinished):
            if not fresh[sent]:
                continue
            kept = sorted(finalized[sent] + fresh[sent], key=lambda h: -float(h["score"]))
            finalized[sent] = kept[:beam_size]
            limit = self.sentence_limit(unfin_idx, beam_size, max_len)
            if step >= min(limit, max_len) or self.is_finished(
                    step, unfin_idx, max_len, 0, beam_size):
                done = True
            elif len(finalized[sent]) < beam_size:
                done = False
            else:
                best_alive = float(rows[unfin_idx, :, step - 1].max()) if step > 0 else 0.0
                divisor = 1.0
                if self.gnmt_normalize or self.normalize_scores:
                    divisor = max(self.length_penalty(step + 1, sent),
                                  self.length_penalty(limit + 1, sent))
                done = best_alive / divisor <= float(finalized[sent][-1]["score"])
            if done:
                finished[sent] = True
                newly_finished.append(unfin_idx)
        return newly_finished

    def sentence_limit(self, unfin_idx: int, beam_size: int, max_len: int) -> int:
        """The most output tokens (EOS excluded) sentence ``unfin_idx`` of the current batch
        may produce: its own limit under a per-sentence cap, else the batch's."""
        limits = getattr(self.model, "row_limits", None)
        if limits is None:
            return max_len
        return min(int(limits[unfin_idx * beam_size]), max_len)


def forced_lengths(prefix_tokens: Tensor | None, constraints: Tensor | None,
                   pad: int) -> Tensor | None:
    """Per sentence, how many output tokens the user forces: the larger of its prefix (without
    padding) and its constraints' total length; None when nothing is forced."""
    lengths = None
    if prefix_tokens is not None:
        lengths = prefix_tokens.ne(pad).long().sum(dim=1).cpu()
    if constraints is not None:
        counted = constraint_lengths(constraints)
        lengths = counted if lengths is None else torch.maximum(lengths, counted)
    return lengths
