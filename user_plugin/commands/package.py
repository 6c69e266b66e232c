"""``vaswani-package``: make a model package of a checkpoint, or check one.

::

    vaswani-package CHECKPOINT --data-dir DATA_BIN --output PACKAGE \\
        [--bpe-codes CODES | --sentencepiece-model SPM] [--scores bleu.json --test-set NAME]
    vaswani-package --check PACKAGE

A package (:mod:`user_plugin.artifacts.package`) is the checkpoint without optimizer state, its
dictionaries, its subword model and text pipeline record, a manifest with every file's sha256
and a model card: the one folder ``vaswani-translate``, ``vaswani-serve`` and ``vaswani-export``
take with no other option. Several checkpoints make an ensemble package. The text pipeline is
found as ``vaswani-translate`` finds it (the record beside the checkpoint or in the data
directory, else the subword model given or found by its usual name). ``--scores`` records the
JSON report of ``vaswani-score --output-json`` in the manifest and the card.

Bad input is one line ``vaswani-package: error: ...``, status 1, and nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..files.errors import console_script

PROG = "vaswani-package"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", type=Path, metavar="CHECKPOINT",
                        help="the checkpoint (several: an ensemble)")
    parser.add_argument("--data-dir", type=Path,
                        help="the folder of its dict.<lang>.txt (default: beside it)")
    parser.add_argument("--output", type=Path, help="the package folder to write")
    parser.add_argument("--source-lang")
    parser.add_argument("--target-lang")
    parser.add_argument("--bpe-codes", type=Path, help="subword-nmt codes, when no "
                        "text_pipeline.json names them")
    parser.add_argument("--sentencepiece-model", type=Path)
    parser.add_argument("--scores", type=Path, metavar="JSON",
                        help="the report of vaswani-score --output-json to record")
    parser.add_argument("--test-set", help="the name of the test set --scores measured")
    parser.add_argument("--check", type=Path, metavar="PACKAGE",
                        help="check PACKAGE against its manifest and say what it is")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status. Bad input raises a :class:`UserError`
    (:func:`cli_main` prints it as one line, status 1)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    from ..registration import register

    register()  # our model and task, safe loading, the checks fairseq's loaders get
    from ..artifacts.package import describe, read_package
    from ..artifacts.packaging import read_scores, write_package

    if args.check is not None:
        if args.checkpoints or args.output is not None:
            parser.error("--check takes a package alone")
        from ..artifacts.model_files import open_model

        manifest = read_package(args.check)
        open_model(args.check).read_states()  # CRC-32s, and the models against the manifest
        print(f"{args.check}: intact model package ({describe(manifest)})")
        return 0
    if not args.checkpoints or args.output is None:
        parser.error("give the CHECKPOINT(s) and --output (or --check PACKAGE)")
    if args.test_set is not None and args.scores is None:
        parser.error("--test-set names the test set of --scores")
    scores = None if args.scores is None else read_scores(args.scores, args.test_set)
    if args.scores is not None:
        from ..files.atomic import refuse_input_clash

        refuse_input_clash(args.output, [args.scores])
    manifest = write_package(args.output, args.checkpoints, args.data_dir or
                             args.checkpoints[0].parent, args.source_lang, args.target_lang,
                             args.bpe_codes, args.sentencepiece_model, scores)
    print(f"wrote the model package {args.output}: {describe(manifest)}", file=sys.stderr)
    return 0


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
