"""The hub's ``ctranslate2`` backend: raw text through a CTranslate2 export, decoded as close to
the paper (§6.1) as the engine allows.

The export directory (``vaswani-export ... --to ctranslate2``) carries the model,
its vocabularies, the subword model and a manifest with the language pair and text pipeline,
so the same :class:`~user_plugin.artifacts.text_pipeline.TextPipeline` (its record, or the
recipes' pipeline assumed for an export without one) runs around it as around the fairseq
backend.

CTranslate2's beam search is fairseq's: ``2 * beam`` candidates per step, an EOS among the top
``beam`` finishes a hypothesis and is replaced by the next candidate that is not EOS, a sentence
stops once ``beam`` hypotheses have finished (when a length penalty is set). The penalty and the
length limit differ, and are made the paper's here:

* **Penalty.** CTranslate2 divides a finished hypothesis' log-probability by ``|Y| ** lp``
  (``|Y|`` with EOS, as fairseq's ``--lenpen``) and has no GNMT form. The beam's hypotheses are
  asked for with their scores and EOS (``num_hypotheses = beam``, ``return_end_token``), the raw
  ``log P(Y|X)`` is recovered as ``score * |Y| ** lp``, and they are re-ranked by
  ``log P / ((5 + |Y|) / 6) ** alpha`` (or fairseq's form on request). The search never reads
  the penalty except to stop: with ``lp = 0`` CTranslate2 stops at the first finished top beam,
  so a tiny ``lp`` (:data:`NO_PENALTY`) stands for alpha 0.
* **Length limit.** Both backends decode by one definition of the limit,
  :func:`~user_plugin.generation.gnmt_sequence_generator.output_limit`: at most the source's
  tokens + 50 before the EOS, within the decoder's positions. ``max_decoding_length`` applies
  to a whole call, so sentences are batched by source length, each batch with its own limit.
  CTranslate2 counts every token it generates, EOS included, and ends a hypothesis that reaches
  ``max_decoding_length`` with its last token, where fairseq's search forces the EOS after the
  limit's tokens (with its model log-probability). ``max_decoding_length`` is therefore the
  limit itself, and a hypothesis that ends without EOS gets its EOS here: CTranslate2 scores it
  (``score_batch``) and its log-probability is added, so that both backends return the same
  tokens, lengths and scores at the limit.

What remains different from our fairseq decoder (docs/export.md measures how often it matters):
when more hypotheses finish at one step than the beam has room for, CTranslate2 keeps the best
by its ``|Y| ** lp`` score where fairseq keeps the best raw ones (at the limit too: fairseq
finishes every live hypothesis with its forced EOS, CTranslate2 the ``beam`` best
candidates of the last step); EOS is impossible at the first
step in both, but CTranslate2 renormalizes without it where fairseq keeps the other
probabilities as they are (every hypothesis of a sentence shifts by the same
``-log(1 - P(EOS first))``, so rankings do not change); and float rounding differs, which flips
near-ties.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..artifacts.ctranslate2_layout import (
    CT2_PAD,
    check_export_directory,
    require_ctranslate2,
)
from ..artifacts.errors import ArtifactError
from ..artifacts.model_files import model_text_pipeline
from ..artifacts.text_pipeline import RECORD_NAME, TextPipeline
from ..files.errors import InvalidValue, first_line
from ..generation.decoding_options import (
    DecodingOptionError,
    check_values,
    penalty_overflow_problem,
)
from ..generation.gnmt_sequence_generator import (
    output_limit,
    penalty_function,
)
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE
from .translator import TextTranslator, sentence_lenpens, too_long

logger = logging.getLogger(__name__)

#: CTranslate2's length penalty used for alpha = 0: any non-zero value keeps fairseq's rule of
#: stopping once ``beam`` hypotheses have finished; the raw scores are recovered exactly.
NO_PENALTY = 1e-6
#: The shortest output (``--min-len``, CTranslate2's ``min_decoding_length``): EOS is not
#: allowed as the first token, as in the fairseq backend.
MIN_LEN = 1
#: CTranslate2's end token (the EOS of fairseq's dictionaries).
EOS = "</s>"


#: The fairseq backend's decoding keywords at their "not asked for" values.
FAIRSEQ_ONLY_DEFAULTS: dict[str, Any] = {
    "unordered_constraints": False, "sampling": False, "sampling_topk": -1,
    "sampling_topp": -1.0, "temperature": 1.0, "seed": None, "alignment": False,
}


def rerank(tokens: Sequence[Sequence[str]], scores: Sequence[float], engine_lp: float,
           alpha: float, form: str,
           eos_log_probs: Sequence[float | None] | None = None) -> list[dict]:
    """CTranslate2's hypotheses (with EOS) ranked by the length penalty ``form`` with
    ``alpha``: dicts ``tokens`` (a string, without EOS), ``score`` (normalized), ``raw_score``
    (``log P(Y|X)``) and ``length`` (``|Y|`` with EOS), best first. ``engine_lp`` is the penalty
    CTranslate2 divided ``scores`` by. ``eos_log_probs`` gives, for a hypothesis that stopped
    at the length limit without EOS, the log-probability of the EOS that ends it (None for the
    others): it is added to the raw score and counted in ``|Y|``, as fairseq's forced EOS."""
    penalty = penalty_function(form)
    ranked = []
    for index, (hypothesis, score) in enumerate(zip(tokens, scores)):
        length = len(hypothesis)
        raw = score * length ** engine_lp
        ended = bool(hypothesis) and hypothesis[-1] == EOS
        words = list(hypothesis[:-1]) if ended else list(hypothesis)
        eos = None if eos_log_probs is None else eos_log_probs[index]
        if eos is not None and not ended:
            raw, length = raw + eos, length + 1
        # an empty source translates to an empty hypothesis (no EOS, nothing to normalize)
        score = raw / penalty(length, alpha) if length else raw
        ranked.append({"tokens": " ".join(words), "score": score, "raw_score": raw,
                       "length": length})
    ranked.sort(key=lambda hypo: -hypo["score"])
    return ranked


class CTranslate2Translator(TextTranslator):
    """A CTranslate2 export with its text pipeline; decoding defaults are the paper's (beam 4,
    GNMT alpha 0.6, each output at most its source length + 50 tokens)."""

    def __init__(self, translator, codec: TextPipeline, manifest: dict, beam: int = BEAM,
                 lenpen: float = LENPEN, length_penalty_form: str = "gnmt",
                 max_len_over_source: int = MAX_LEN_OVER_SOURCE, batch_size: int = 64) -> None:
        penalty_function(length_penalty_form)
        check_values(beam=beam, lenpen=lenpen, batch_size=batch_size,
                     max_len_over_source=max_len_over_source)
        if max_len_over_source < 0:
            raise InvalidValue("the ctranslate2 backend needs a per-sentence limit: "
                             f"max_len_over_source >= 0, got {max_len_over_source}")
        self.translator = translator
        self.codec = codec
        self.manifest = manifest
        self.beam = beam
        self.lenpen = lenpen
        self.length_penalty_form = length_penalty_form
        self.max_len_over_source = max_len_over_source
        self.batch_size = batch_size
        self.max_source_tokens = int(manifest["max_source_positions"])
        self.max_target_tokens = int(manifest["max_target_positions"])

    def source_limit(self) -> int | None:
        return self.max_source_tokens

    def source_symbols(self) -> set[str]:
        directory = Path(self.manifest["directory"])
        for name in ("shared_vocabulary.json", "source_vocabulary.json"):
            if (directory / name).is_file():
                return set(json.loads((directory / name).read_text(encoding="utf-8")))
        raise ArtifactError(f"{directory}: no source vocabulary file")

    def output_limit(self, source_tokens: int) -> int:
        """The most tokens before EOS of the output of a source of ``source_tokens`` tokens (no
        EOS): :func:`~user_plugin.generation.gnmt_sequence_generator.output_limit`, as the
        fairseq backend counts it. It is CTranslate2's ``max_decoding_length``: an output
        that ends at the limit without EOS gets its EOS in :meth:`_decode`."""
        return output_limit(source_tokens, self.max_len_over_source, self.max_target_tokens,
                            MIN_LEN)

    def translate_tokens(
        self, lines: Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | Sequence[float] | None = None,
        constraints: Sequence[Sequence[str]] | None = None, **decoding: Any,
    ) -> list[list[dict]]:
        """Decode already encoded source lines (model tokens, space separated): per line,
        ``nbest`` dicts best first (see :func:`rerank`). This backend is the paper's beam
        search only: constraints, sampling and alignments are a ``ValueError`` naming the
        option, since CTranslate2 has no GNMT re-ranking for them."""
        asked = sorted(name for name, value in decoding.items()
                       if name not in FAIRSEQ_ONLY_DEFAULTS
                       or value != FAIRSEQ_ONLY_DEFAULTS[name])
        if constraints is not None:
            asked.insert(0, "constraints")
        if asked:
            raise InvalidValue(
                f"the ctranslate2 backend decodes by beam search only; {', '.join(asked)} "
                "need the fairseq backend (the checkpoint, not the export)"
            )
        beam = self.beam if beam is None else beam
        alphas = sentence_lenpens(lenpen, len(lines)) or \
            [self.lenpen if lenpen is None else lenpen] * len(lines)
        check_values(beam=beam, nbest=nbest)
        if nbest > beam:
            raise DecodingOptionError(f"--nbest: must be between 1 and --beam {beam} (the "
                                      f"hypotheses a search keeps), got {nbest}")
        for alpha in set(alphas):
            check_values(lenpen=alpha)
            # CTranslate2 divides by |Y| ** alpha itself, whichever form re-ranks afterwards
            problem = penalty_overflow_problem(alpha, self.max_target_tokens,
                                               ("fairseq", self.length_penalty_form))
            if problem is not None:
                raise DecodingOptionError(problem)
        sources = [line.split() for line in lines]
        for number, source in enumerate(sources, start=1):
            if len(source) + 1 > self.max_source_tokens:
                raise InvalidValue(too_long(number, len(source) + 1, self.max_source_tokens))
        # CTranslate2 takes one penalty per call: sentences are grouped by length and alpha
        by_length: dict[tuple[int, float], list[int]] = defaultdict(list)
        for index, source in enumerate(sources):
            by_length[len(source), alphas[index]].append(index)
        results: list[list[dict]] = [[] for _ in sources]
        for (length, alpha), indices in sorted(by_length.items()):
            engine_lp = alpha if alpha != 0 else NO_PENALTY
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start: start + self.batch_size]
                hypotheses = self._decode([sources[i] for i in chunk], length, beam, engine_lp)
                for index, (tokens, scores, eos) in zip(chunk, hypotheses):
                    ranked = rerank(tokens, scores, engine_lp, alpha, self.length_penalty_form,
                                    eos)
                    results[index] = ranked[:nbest]
        return results

    def _decode(self, sources: list[list[str]], length: int, beam: int, engine_lp: float
                ) -> list[tuple[list[list[str]], list[float], list[float | None]]]:
        """CTranslate2's beam search over ``sources`` (all of ``length`` tokens): per sentence,
        the beam's hypotheses (tokens, EOS included where they end with it), CTranslate2's
        scores, and for each hypothesis that reached the length limit without EOS the
        log-probability of that EOS (None for the others; see :func:`rerank`).

        fairseq never extends a hypothesis with padding but keeps the other probabilities as
        they are; CTranslate2 can only suppress a token by renormalizing without it, which
        shifts the scores. Sentences are decoded without suppression, and only those where
        padding made it into a hypothesis (a model that gives padding real probability) are
        decoded again with padding suppressed."""
        options = dict(beam_size=beam, num_hypotheses=beam, length_penalty=engine_lp,
                       return_scores=True, return_end_token=True, max_input_length=0,
                       max_decoding_length=self.output_limit(length),
                       min_decoding_length=MIN_LEN)
        outputs = self.translator.translate_batch(sources, **options)
        padded = [i for i, output in enumerate(outputs)
                  if any(CT2_PAD in hypothesis for hypothesis in output.hypotheses)]
        if padded:
            again = self.translator.translate_batch([sources[i] for i in padded],
                                                    suppress_sequences=[[CT2_PAD]], **options)
            for i, output in zip(padded, again):
                outputs[i] = output
        decoded = [(list(output.hypotheses), list(output.scores), [None] * len(output.scores))
                   for output in outputs]
        self._score_forced_eos(sources, decoded)
        return decoded

    def _score_forced_eos(self, sources: list[list[str]], decoded: list) -> None:
        """Fill in the EOS log-probability of every hypothesis of ``decoded`` that stopped at
        the limit without EOS, scored by CTranslate2 after its tokens (one ``score_batch``
        call for all of them)."""
        at_limit = [(sentence, index) for sentence, (hypotheses, _, _) in enumerate(decoded)
                    for index, hypothesis in enumerate(hypotheses)
                    if hypothesis and hypothesis[-1] != EOS]
        if not at_limit:
            return
        scored = self.translator.score_batch(
            [sources[sentence] for sentence, _ in at_limit],
            [decoded[sentence][0][index] for sentence, index in at_limit],
            max_input_length=0)
        for (sentence, index), result in zip(at_limit, scored):
            decoded[sentence][2][index] = float(result.log_probs[-1])


def open_export(
    model_dir: str | os.PathLike,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
    moses: bool | None = None,
    device: str = "cpu",
    threads: int = 0,
    compute_type: str = "default",
) -> tuple[object, TextPipeline, dict]:
    """CTranslate2's translator, the text codec and the manifest of an export directory,
    checked against its manifest first; a one-line :class:`ArtifactError` for a missing, corrupt
    or mixed directory, or for languages other than the export's. The text pipeline is the
    export's record (:mod:`user_plugin.artifacts.model_files`), else the recipes' on the
    manifest's subword model and Moses setting, with one warning line.

    ``threads`` is CTranslate2's ``intra_threads`` (0: its default); ``compute_type``
    "default" runs the weights' type as exported (e.g. int8).
    """
    ctranslate2 = require_ctranslate2()
    model_dir = Path(model_dir)
    manifest = dict(check_export_directory(model_dir), directory=str(model_dir))
    for given, side in ((source_lang, "source_lang"), (target_lang, "target_lang")):
        if given is not None and given != manifest[side]:
            raise ArtifactError(f"{model_dir}: the export translates {manifest['source_lang']}->"
                           f"{manifest['target_lang']}, not {side} {given!r}")
    found = tuple(model_dir / Path(manifest[key]).name if manifest.get(key) else None
                  for key in ("bpe_codes", "sentencepiece_model"))
    if moses is None and not (model_dir / RECORD_NAME).is_file():
        moses = bool(manifest["moses"])
    codec, note = model_text_pipeline(
        [model_dir], manifest["source_lang"], manifest["target_lang"],
        bpe_codes=None if bpe_codes is None else Path(bpe_codes),
        sentencepiece_model=None if sentencepiece_model is None else Path(sentencepiece_model),
        moses=moses, found=found)
    if note is not None:
        logger.warning(note)
    try:
        engine = ctranslate2.Translator(str(model_dir), device=device,
                                        compute_type=compute_type, inter_threads=1,
                                        intra_threads=threads)
    except (RuntimeError, ValueError) as error:
        raise ArtifactError(f"{model_dir}: CTranslate2 cannot load the model "
                       f"({first_line(error)})") from None
    return engine, codec, manifest
