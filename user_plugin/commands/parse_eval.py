"""EVALB-compatible bracket scoring of parse trees (COLLINS.prm conventions, paper §6.3).

    vaswani-parse-eval --gold GOLD --pred PRED [--summary-only] [--json-out F]

GOLD and PRED hold one bracketed tree per line, line i of PRED being the parse of line i of
GOLD. The output is EVALB's: a table with one row per sentence (recall, precision, matched,
gold and test brackets, crossing brackets, words, correct tags), then the summary lines
(``Bracketing Recall``, ``Bracketing Precision``, ``Bracketing FMeasure``, ``Complete match``,
``Tagging accuracy``...) for all sentences and for those of at most 40 words, so the script can
stand in for ``evalb -p COLLINS.prm GOLD PRED``. The conventions are listed in
``user_plugin/parsing/evalb.py``.

As in EVALB, a test line with no words (an empty line) is a skipped sentence and a test tree
whose words differ from the gold's, or that cannot be read, is an error sentence: both are
counted and named on stderr, and more than ``--max-errors`` (COLLINS.prm: 10) stop the run. A
gold line that is not a tree, a missing file or files of different lengths are errors: one line
on stderr, exit status 1.

``--punctuation-from-gold`` (not an EVALB setting) lets the gold tags decide which words are
punctuation on both sides, so that a parser that tags a punctuation word otherwise than the
gold gets a tagging error instead of an error sentence left out of the totals; every sentence
EVALB scores keeps its figures. The parsing recipe scores this way.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

# The parsing modules live in the plugin package, whose import brings fairseq, which sets up
# INFO logging on import: keep stderr to warnings and errors.
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from nltk import Tree  # noqa: E402

from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write_text,
    console_script,
    read_lines,
    refuse_input_clash,
)
from user_plugin.parsing.evalb import (  # noqa: E402
    COLLINS,
    ERROR,
    EvalbError,
    EvalbParameters,
    Spans,
    report_lines,
    score_corpus,
    sentence_records,
    sentence_spans,
    spans_of,
)
from user_plugin.parsing.trees import TreebankError, parse_tree  # noqa: E402


def read_gold(lines: Sequence[str], path: Path) -> list[Tree]:
    """The gold trees must all be trees: anything else is the user's error."""
    trees = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise UserError(f"{path}:{number}: empty line, expected a gold tree")
        try:
            trees.append(parse_tree(line, f"{path}:{number}"))
        except TreebankError as error:
            raise UserError(str(error)) from None
    return trees


def compared_spans(gold: Sequence[Tree], lines: Sequence[str], path: Path,
                   params: EvalbParameters) -> Iterator[tuple[Spans, Spans]]:
    """Gold and test spans per sentence: an empty test line is a skipped sentence, an
    unreadable test tree an error sentence."""
    for number, (gold_tree, line) in enumerate(zip(gold, lines), start=1):
        if not line.strip():
            yield spans_of(gold_tree, params), Spans()
            continue
        try:
            test_tree = parse_tree(line, f"{path}:{number}")
        except TreebankError as error:
            yield spans_of(gold_tree, params), Spans(error=str(error))
            continue
        yield sentence_spans(gold_tree, test_tree, params)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--gold", type=Path, required=True, help="gold trees, one per line")
    parser.add_argument("--pred", type=Path, required=True, help="parsed trees, one per line")
    parser.add_argument("--cutoff-len", type=int, default=COLLINS.cutoff_length,
                        help="length limit of the second summary (default: 40)")
    parser.add_argument("--max-errors", type=int, default=COLLINS.max_errors,
                        help="stop after more error sentences than this (default: 10; "
                        "negative: never)")
    parser.add_argument("--unlabeled", action="store_true", help="ignore bracket labels")
    parser.add_argument("--punctuation-from-gold", action="store_true",
                        help="not in EVALB: the gold tags decide which words are punctuation "
                        "on both sides, so a mistagged punctuation word is a tagging error, "
                        "not an error sentence left out of the totals")
    parser.add_argument("--summary-only", action="store_true",
                        help="print the summary without the per-sentence table")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="also write the figures, per sentence with F1, as JSON")
    args = parser.parse_args(argv)
    params = EvalbParameters(cutoff_length=args.cutoff_len, max_errors=args.max_errors,
                             labeled=not args.unlabeled,
                             punctuation_from_gold=args.punctuation_from_gold)

    if args.json_out is not None:
        refuse_input_clash(args.json_out, [args.gold, args.pred])
    gold_lines = read_lines(args.gold)
    pred_lines = read_lines(args.pred)
    if not gold_lines:
        raise UserError(f"{args.gold}: no trees")
    if len(gold_lines) != len(pred_lines):
        raise UserError(f"{args.gold} has {len(gold_lines)} lines but {args.pred} has "
                        f"{len(pred_lines)}: one parse per gold tree expected")
    gold = read_gold(gold_lines, args.gold)
    try:
        result = score_corpus(compared_spans(gold, pred_lines, args.pred, params), params)
    except EvalbError as error:
        raise UserError(str(error)) from None
    for score in result.sentences:
        if score.status == ERROR:
            print(f"{score.id} : {score.message}", file=sys.stderr)
    print("\n".join(report_lines(result, table=not args.summary_only)))
    if args.json_out is not None:
        payload = {
            "all": result.all.as_dict(),
            f"len<={params.cutoff_length}": result.short.as_dict(),
            "sentences": sentence_records(result.sentences),
        }
        atomic_write_text(args.json_out, json.dumps(payload, indent=1) + "\n")
    return 0


PROG = "vaswani-parse-eval"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
