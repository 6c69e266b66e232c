"""Score detokenized translations two ways: the paper's tokenized BLEU, and sacreBLEU.

The EN-DE numbers of the paper (Table 2, §6.1) come from tensor2tensor, whose
``get_ende_bleu.sh`` Moses-tokenizes the output, splits hyphenated compounds
(``rich-text`` -> ``rich ##AT##-##AT## text``, for comparison with GNMT and ConvS2S) and runs
Moses' ``multi-bleu.perl`` against a reference prepared the same way. This script does these
steps in Python for both sides:

1. Moses tokenization of hypotheses and references in the target language (sacremoses, the
   defaults of ``tokenizer.perl -l LANG``: no aggressive hyphen splitting, XML escaping);
2. compound splitting ``(\\S)-(\\S)`` -> ``\\1 ##AT##-##AT## \\2`` (``--no-compound-split`` turns
   it off; the paper's EN-FR numbers do not use it);
3. corpus BLEU of the whitespace-separated tokens as ``multi-bleu.perl`` computes it: clipped
   n-gram precisions for n = 1..4 summed over the corpus, geometric mean, brevity penalty
   ``exp(1 - ref_len / hyp_len)`` when the output is shorter, 0 when a precision is 0. This is
   sacreBLEU's corpus BLEU of pre-tokenized text (``tokenize="none"``, no smoothing).

It also reports sacreBLEU on the detokenized text, with its signature, the number to compare
across papers (typically 0.5-1.5 lower than the tokenized one).

Both files are compared in Unicode NFC (the same text typed with decomposed accents scores as
its precomposed form). Files that are not text to score are refused in one line that names the
command making them so: hypotheses that are still fairseq-generate output lines (any line
``H-12<TAB>-0.35<TAB>...``, or ``S-``, ``T-``, ``D-``, ``P-``...: no translation starts with a
kind letter, an id and a tab, and the hub and ``vaswani-prepare-text`` never write tabs), and
files where a tenth or more of the non-empty lines hold subword pieces (``@@ `` joiners,
SentencePiece's ``\u2581``).

    vaswani-score --hyp hyp.detok.de --ref newstest2014.de \\
        --target-lang de [--no-compound-split] [--output-json bleu.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# Logging set up before fairseq is imported (see user_plugin.files).
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write_text,
    console_script,
    iter_lines,
    refuse_input_clash,
)
from user_plugin.files.text import BYTE_ORDER_MARK  # noqa: E402

#: ``perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`` on bytes: ASCII whitespace only.
COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)", re.ASCII)
#: ``multi-bleu.perl`` splits lines into tokens at (ASCII) whitespace.
WHITESPACE = re.compile(r"\s+", re.ASCII)
MAX_ORDER = 4
#: A line of fairseq-generate's output: a kind letter (S source, T target, H hypothesis,
#: D detokenized hypothesis, P positional scores, A alignment, C constraint, E steps,
#: I iterations, W time), the sentence id, a tab.
GENERATE_LINE = re.compile(r"^[STHDPACEIW]-\d+\t")
#: subword-nmt's joiner: ``@@`` ending a piece, before a space or at the end of the line.
BPE_JOINER = re.compile(r"\S@@(?: |$)")
#: SentencePiece's word-start mark (U+2581).
SENTENCEPIECE_MARK = "\u2581"
#: The share of a file's non-empty lines that must hold subword pieces for it to be refused as
#: subword text: in BPE or SentencePiece output most lines have a split word, while real text
#: may hold an odd ``@@`` (an address, a handle) on a line here and there.
SUBWORD_SHARE = 0.1


def split_compounds(line: str) -> str:
    """Put hyphenated compounds in ##AT## form, like tensor2tensor's ``get_ende_bleu.sh``.

    Matches do not overlap, as in Perl: ``a-b-c`` becomes ``a ##AT##-##AT## b-c``.
    """
    return COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", line)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Tokenize detokenized lines as Moses' ``tokenizer.perl -l lang`` does by default."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, return_str=True, escape=True) for line in lines]


def tokens(line: str) -> list[str]:
    """The whitespace-separated tokens of a line."""
    return [token for token in WHITESPACE.split(line) if token]


@dataclass
class BleuResult:
    """Corpus BLEU as ``multi-bleu.perl`` reports it (score and precisions in percent)."""

    score: float
    precisions: list[float]
    brevity_penalty: float
    ratio: float
    hyp_len: int
    ref_len: int

    def __str__(self) -> str:
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        return (f"BLEU = {self.score:.2f}, {precisions} (BP={self.brevity_penalty:.3f}, "
                f"ratio={self.ratio:.3f}, hyp_len={self.hyp_len}, ref_len={self.ref_len})")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BleuResult:
    """Corpus BLEU of tokenized lines (one reference each), as ``multi-bleu.perl`` computes it.

    sacreBLEU counts the n-grams (``tokenize="none"``: its input is already tokenized; no
    smoothing, so a zero precision gives 0 as in ``multi-bleu.perl``). It splits lines with
    ``str.split``, at any Unicode whitespace, where ``multi-bleu.perl`` splits at ASCII
    whitespace only: each token is therefore handed to it as a number standing for that token,
    so that a token holding, say, a no-break space stays one token.
    """
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    numbers: dict[str, str] = {}

    def numbered(line: str) -> str:
        return " ".join(numbers.setdefault(token, str(len(numbers))) for token in tokens(line))

    metric = BLEU(tokenize="none", smooth_method="none", max_ngram_order=MAX_ORDER, force=True)
    result = metric.corpus_score([numbered(line) for line in hypotheses],
                                 [[numbered(line) for line in references]])
    if result.ref_len == 0:
        raise UserError("the references have no tokens")
    return BleuResult(result.score, list(result.precisions), result.bp,
                      result.sys_len / result.ref_len, result.sys_len, result.ref_len)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str,
                   compound_split: bool = True) -> BleuResult:
    """The paper's BLEU: Moses tokenization, optional compound splitting, ``multi-bleu``."""
    prepared = []
    for lines in (hypotheses, references):
        tokenized = moses_tokenize(lines, lang)
        prepared.append([split_compounds(line) for line in tokenized] if compound_split
                        else tokenized)
    return corpus_bleu(prepared[0], prepared[1])


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str],
                    lang: str) -> tuple[BleuResult, str]:
    """sacreBLEU on detokenized text (its default tokenizer for ``lang``) and its signature."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(trg_lang=lang)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    bleu = BleuResult(result.score, list(result.precisions), result.bp,
                      result.sys_len / result.ref_len if result.ref_len else 0.0,
                      result.sys_len, result.ref_len)
    return bleu, str(metric.get_signature())


def sentences(path: Path) -> list[str]:
    """The lines of ``path`` by the line rule, without a byte-order mark at the start of the
    file or of any line (files joined with ``cat`` keep each one's mark): a mark is not text,
    and glued to the first word it would make that word differ from the hypothesis'. Lines are
    compared in Unicode NFC: a word typed with decomposed accents (NFD, as macOS gives it) is
    the same word as its precomposed form, and scored so."""
    return [unicodedata.normalize("NFC", line.removeprefix(BYTE_ORDER_MARK))
            for line in iter_lines(path)]


def generate_lines(lines: Sequence[str]) -> list[str]:
    """The lines that are fairseq-generate output lines (``H-12\\t-0.35\\t...``)."""
    return [line for line in lines if GENERATE_LINE.match(line)]


def subword_lines(lines: Sequence[str]) -> tuple[str, int] | None:
    """``(method, count)`` when at least :data:`SUBWORD_SHARE` of the non-empty ``lines`` hold
    subword pieces (BPE joiners ``@@ ``, SentencePiece's ``\u2581``), None otherwise."""
    filled = [line for line in lines if line.strip()]
    for method, test in (("bpe", BPE_JOINER.search),
                         ("sentencepiece", lambda line: SENTENCEPIECE_MARK in line)):
        count = sum(1 for line in filled if test(line))
        if count and count >= SUBWORD_SHARE * len(filled):
            return method, count
    return None


def not_a_translation(path: Path, lines: Sequence[str], lang: str, expected: int,
                      reference: bool = False) -> str | None:
    """Why the lines of ``path`` are not text to score (fairseq-generate output lines, subword
    pieces), with the command that makes them so, or None. ``expected`` is the number of
    sentences (the reference's lines)."""
    q = shlex.quote
    logged = generate_lines(lines)
    if logged:
        what = (f"{path}: {len(logged)} of {len(lines)} lines are fairseq-generate output "
                f"lines ({logged[0][:24]!r}...), not ")
        if reference:
            return what + "a reference; give the reference text"
        extracted = Path(f"{path}.hyp")
        detokenized = Path(f"{path}.detok")
        texts = [line.split("\t", 2)[-1] for line in logged if line[:2] in ("H-", "D-")]
        pieces = subword_lines(texts)
        subwords = f" --subwords {pieces[0]}" if pieces else ""
        if not texts:
            return (what + "translations, and no H- line (hypothesis) among them: take the "
                    "hypotheses out of the whole fairseq-generate output with "
                    f"'vaswani-prepare-text extract-hypotheses --expected {expected} "
                    f"GENERATE_OUTPUT {q(str(extracted))}', then detokenize them")
        return (what + "translations: take the hypotheses out in source order and detokenize "
                f"them with 'vaswani-prepare-text extract-hypotheses --expected {expected} "
                f"{q(str(path))} {q(str(extracted))} && vaswani-prepare-text detokenize --lang "
                f"{q(lang)}{subwords} {q(str(extracted))} {q(str(detokenized))}', then score "
                f"{detokenized}")
    pieces = subword_lines(lines)
    if pieces is None:
        return None
    method, count = pieces
    mark = "BPE joiners ('@@ ')" if method == "bpe" else "SentencePiece pieces ('\u2581')"
    what = f"{path}: {count} of {len(lines)} lines hold {mark}: subword pieces, not "
    if reference:
        return what + "a reference; give the raw (detokenized) reference text"
    detokenized = Path(f"{path}.detok")
    return (what + "text; join them with 'vaswani-prepare-text detokenize --lang "
            f"{q(lang)} --subwords {method} {q(str(path))} {q(str(detokenized))}', then score "
            f"{detokenized}")


def read_pair(hyp: Path, ref: Path, lang: str = "") -> tuple[list[str], list[str]]:
    """Hypothesis and reference lines, refusing files whose line counts differ, and files that
    still hold fairseq-generate output lines or subword pieces (:func:`not_a_translation`).
    Only LF ends a line (the project's rule, that of ``wc -l`` and the recipes' checks): a
    stray CR, form feed, NEL or U+2028 inside a sentence stays in it, so line N of both files
    stays a pair."""
    hypotheses, references = sentences(hyp), sentences(ref)
    for path, lines, reference in ((hyp, hypotheses, False), (ref, references, True)):
        problem = not_a_translation(path, lines, lang or "LANG", len(references), reference)
        if problem is not None:
            raise UserError(problem)
    if len(hypotheses) != len(references):
        raise UserError(f"line counts differ: {hyp} has {len(hypotheses)} lines, {ref} has "
                        f"{len(references)}")
    if not references:
        raise UserError(f"{ref}: no lines to score")
    return hypotheses, references


def score_files(hyp: Path, ref: Path, lang: str,
                compound_split: bool = True) -> tuple[BleuResult, BleuResult, dict]:
    """Tokenized BLEU and sacreBLEU of a hypothesis file, and both as a JSON-ready dict."""
    hypotheses, references = read_pair(hyp, ref, lang)
    tokenized = tokenized_bleu(hypotheses, references, lang, compound_split)
    sacre, signature = sacrebleu_score(hypotheses, references, lang)
    report = {
        "hyp": str(hyp),
        "ref": str(ref),
        "target_lang": lang,
        "num_sentences": len(references),
        "tokenized_bleu": {**asdict(tokenized), "compound_split": compound_split,
                           "tokenizer": f"moses -l {lang}"},
        "sacrebleu": {**asdict(sacre), "signature": signature},
    }
    return tokenized, sacre, report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tokenized BLEU with compound splitting (the paper's EN-DE numbers) and "
                    "sacreBLEU, for detokenized hypotheses and references.")
    parser.add_argument("--hyp", required=True, type=Path, help="detokenized hypotheses")
    parser.add_argument("--ref", required=True, type=Path, help="detokenized references")
    parser.add_argument("--target-lang", required=True, metavar="LANG",
                        help="language of both files (Moses tokenizer, sacreBLEU), e.g. de")
    parser.add_argument("--no-compound-split", action="store_true",
                        help="do not split hyphenated compounds (the paper's EN-FR scoring)")
    parser.add_argument("--output-json", type=Path, metavar="FILE",
                        help="also save both scores to FILE (written atomically)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    compound_split = not args.no_compound_split
    if args.output_json is not None:
        refuse_input_clash(args.output_json, [args.hyp, args.ref])
        if os.path.isdir(args.output_json):
            raise UserError(f"{args.output_json}: is a directory; --output-json names the "
                            "report's file (nothing was scored)")
    tokenized, sacre, report = score_files(args.hyp, args.ref, args.target_lang, compound_split)
    how = "with" if compound_split else "without"
    print(f"scored {report['num_sentences']} sentences of {args.hyp} against {args.ref}")
    print(f"tokenized BLEU (Moses -l {args.target_lang}, {how} compound splitting, multi-bleu): "
          f"{tokenized}")
    print(f"sacreBLEU: {sacre} {report['sacrebleu']['signature']}")
    if args.output_json is not None:
        atomic_write_text(args.output_json, json.dumps(report, indent=2) + "\n",
                          inputs=[args.hyp, args.ref])
        print(f"wrote {args.output_json}")
    return 0


PROG = "vaswani-score"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
