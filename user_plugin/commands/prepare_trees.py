"""Treebank preparation for the parsing recipe (paper §6.3, recipes/ptb_parsing/).

Subcommands:

* ``prepare``: read a Penn Treebank (``--ptb-dir``, LDC layout ``wsj/SS/wsj_SSNN.mrg`` or
  ``train.trees``/``dev.trees``/``test.trees``), normalize its trees and write, for each split
  (``train`` = sections 02-21, ``valid`` = 22, ``test`` = 23): ``SPLIT.words`` (the source
  sentences), ``SPLIT.brackets`` (the linearized trees, Vinyals et al. 2015) and ``SPLIT.gold``
  (the normalized trees, one per line, for scoring). Every file is read and checked before
  anything is written.
* ``synthesize``: write a synthetic treebank (``train.trees``, ``dev.trees``, ``test.trees``)
  from the project's grammar, for tests and the demo.
* ``delinearize``: turn fairseq-generate's hypotheses (in sentence order) back into trees over
  the source words, repairing malformed ones; print how many needed which repair and how many
  were replaced by the flat fallback tree.

Outputs are written atomically; bad input gives one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# The parsing modules live in the plugin package, whose import brings fairseq, which sets up
# INFO logging on import: keep stderr to warnings and errors.
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write_text,
    console_script,
    int_at_least,
    read_lines,
    refuse_input_clash,
)
from user_plugin.parsing.linearize import REPAIR_KINDS, delinearize, linearize  # noqa: E402
from user_plugin.parsing.splits import find_split_files  # noqa: E402
from user_plugin.parsing.synthetic_treebank import generate_splits  # noqa: E402
from user_plugin.parsing.trees import (  # noqa: E402
    TreebankError,
    normalize,
    parse_tree,
    read_trees,
    tags_of,
    tree_to_line,
    words_of,
)

POS_TAG_CHOICES = ("xx", "keep")


def write_lines(path: Path, lines: Sequence[str]) -> None:
    atomic_write_text(path, "".join(line + "\n" for line in lines))


# ---------------------------------------------------------------------------------------------
# prepare


def prepare_split(files: Sequence[Path], keep_tags: bool) -> dict:
    """The source, target and gold lines of one split, and what was dropped."""
    words, brackets, gold = [], [], []
    dropped = 0
    for path in files:
        for tree in read_trees(path):
            normalized = normalize(tree)
            if normalized is None:
                dropped += 1
                continue
            words.append(" ".join(words_of(normalized)))
            brackets.append(" ".join(linearize(normalized, keep_tags=keep_tags)))
            gold.append(tree_to_line(normalized))
    if not words:
        raise UserError(f"{files[0]}: no sentence left after normalization")
    return {"words": words, "brackets": brackets, "gold": gold, "dropped": dropped}


def cmd_prepare(args: argparse.Namespace) -> int:
    refuse_input_clash(args.out_dir, [args.ptb_dir])
    keep_tags = args.pos_tags == "keep"
    try:
        split_files = find_split_files(args.ptb_dir)
        prepared = {split: prepare_split(files, keep_tags) for split, files in split_files.items()}
    except TreebankError as error:
        raise UserError(str(error)) from None
    stats = {"pos_tags": args.pos_tags, "ptb_dir": str(args.ptb_dir), "splits": {}}
    for split, data in prepared.items():
        for kind in ("words", "brackets", "gold"):
            write_lines(args.out_dir / f"{split}.{kind}", data[kind])
        lengths = [len(line.split()) for line in data["words"]]
        target_lengths = [len(line.split()) for line in data["brackets"]]
        stats["splits"][split] = {
            "files": len(split_files[split]), "sentences": len(data["words"]),
            "dropped_empty": data["dropped"], "max_words": max(lengths),
            "max_target_tokens": max(target_lengths),
            "word_types": len({w for line in data["words"] for w in line.split()}),
            "target_types": len({t for line in data["brackets"] for t in line.split()}),
        }
        s = stats["splits"][split]
        print(f"{split}: {s['sentences']} trees from {s['files']} file(s) "
              f"({s['dropped_empty']} empty after normalization dropped), "
              f"{s['word_types']} word types, {s['target_types']} target types, "
              f"at most {s['max_words']} words / {s['max_target_tokens']} target tokens",
              file=sys.stderr)
    atomic_write_text(args.out_dir / "prepare.json", json.dumps(stats, indent=1) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------
# synthesize


def cmd_synthesize(args: argparse.Namespace) -> int:
    refuse_input_clash(args.out_dir)
    sizes = {"train": args.train, "dev": args.dev, "test": args.test}
    try:
        splits = generate_splits(sizes, seed=args.seed, max_words=args.max_words)
    except ValueError as error:
        raise UserError(str(error)) from None
    for name, trees in splits.items():
        write_lines(args.out_dir / f"{name}.trees", [tree_to_line(tree) for tree in trees])
    print(f"synthetic treebank (seed {args.seed}): " +
          ", ".join(f"{len(trees)} {name}" for name, trees in splits.items()) +
          f" trees -> {args.out_dir}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# delinearize


def cmd_delinearize(args: argparse.Namespace) -> int:
    inputs = [path for path in (args.words, args.hypotheses, args.tags_from) if path is not None]
    refuse_input_clash(args.output, inputs)
    if args.report is not None:
        refuse_input_clash(args.report, [*inputs, args.output])
    sentences = read_lines(args.words)
    hypotheses = read_lines(args.hypotheses)
    if len(hypotheses) != len(sentences):
        raise UserError(f"{args.hypotheses}: {len(hypotheses)} hypotheses for "
                        f"{len(sentences)} sentences in {args.words}")
    tags = None
    if args.tags_from is not None:
        gold_lines = read_lines(args.tags_from)
        if len(gold_lines) != len(sentences):
            raise UserError(f"{args.tags_from}: {len(gold_lines)} trees for "
                            f"{len(sentences)} sentences in {args.words}")
        tags = []
        for number, (line, sentence) in enumerate(zip(gold_lines, sentences), start=1):
            try:
                tree = parse_tree(line, f"{args.tags_from}:{number}")
            except TreebankError as error:
                raise UserError(str(error)) from None
            if words_of(tree) != sentence.split():
                raise UserError(f"{args.tags_from}:{number}: its words differ from line "
                                f"{number} of {args.words}")
            tags.append(tags_of(tree))
    totals: Counter = Counter()
    repaired = 0
    trees = []
    for index, (sentence, hypothesis) in enumerate(zip(sentences, hypotheses)):
        words = sentence.split()
        if not words:
            raise UserError(f"{args.words}:{index + 1}: empty sentence")
        result = delinearize(hypothesis.split(), words, tags[index] if tags else None)
        totals.update(result.repairs)
        repaired += int(result.repaired)
        trees.append(tree_to_line(result.tree))
    write_lines(args.output, trees)
    report = {"sentences": len(trees), "repaired_sentences": repaired,
              "fallback_trees": totals["fallback_trees"],
              "repairs": {kind: totals[kind] for kind in REPAIR_KINDS}}
    if args.report is not None:
        atomic_write_text(args.report, json.dumps(report, indent=1) + "\n")
    details = ", ".join(f"{kind} {totals[kind]}" for kind in REPAIR_KINDS if totals[kind])
    print(f"{len(trees)} trees -> {args.output}; {repaired} needed repairs"
          f"{' (' + details + ')' if details else ''}; "
          f"fallback trees: {totals['fallback_trees']}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------




def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="normalize and linearize a Penn Treebank")
    p.add_argument("--ptb-dir", type=Path, required=True,
                   help="wsj/SS/wsj_SSNN.mrg or train.trees, dev.trees, test.trees")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--pos-tags", choices=POS_TAG_CHOICES, default="keep",
                   help="keep: the target holds the part-of-speech tags, which the model "
                   "predicts (default); xx: every tag becomes XX (Vinyals et al.)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("synthesize", help="a synthetic treebank from the project's grammar")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--train", type=int_at_least(1), default=6000)
    p.add_argument("--dev", type=int_at_least(1), default=300)
    p.add_argument("--test", type=int_at_least(1), default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-words", type=int_at_least(1), default=40)
    p.set_defaults(func=cmd_synthesize)

    p = sub.add_parser("delinearize", help="hypotheses back to trees (repaired, counted)")
    p.add_argument("--words", type=Path, required=True, help="source sentences, one per line")
    p.add_argument("--hypotheses", type=Path, required=True,
                   help="linearized trees, one per line, in the same order")
    p.add_argument("--tags-from", type=Path, default=None,
                   help="trees whose part-of-speech tags the output trees take (e.g. the gold "
                   "trees when the target has XX); default: the tags in the hypotheses")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--report", type=Path, default=None, help="repair counts as JSON")
    p.set_defaults(func=cmd_delinearize)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


PROG = "vaswani-prepare-trees"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
