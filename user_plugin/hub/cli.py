"""``python -m user_plugin.hub MODEL_DIR``: translate stdin line by line to stdout.

Decoding is the paper's (beam 4, GNMT alpha 0.6, source + 50) unless options say otherwise:
``--nbest`` prints that many translations per input line (one per output line), ``--sampling``
(with ``--sampling-topk``, ``--sampling-topp``, ``--temperature``, ``--seed``) draws samples,
and ``--constraints`` reads each input line as ``source<TAB>phrase<TAB>phrase...`` (as
``fairseq-interactive --constraints`` does), the phrases being raw target text the translation
must contain.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..files.errors import UserError
from .loader import load_translator


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m user_plugin.hub MODEL_DIR``: translate stdin, one sentence per line."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("--checkpoints", nargs="+", help="several = an ensemble")
    parser.add_argument("--data-dir")
    parser.add_argument("--source-lang")
    parser.add_argument("--target-lang")
    parser.add_argument("--bpe-codes")
    parser.add_argument("--sentencepiece-model")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--nbest", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--constraints", nargs="?", const="ordered",
                        choices=("ordered", "unordered"),
                        help="input lines are source<TAB>phrase<TAB>...; the translation "
                        "contains every phrase (in order unless 'unordered')")
    parser.add_argument("--sampling", action="store_true",
                        help="sample --nbest translations instead of beam search")
    parser.add_argument("--sampling-topk", type=int, default=-1)
    parser.add_argument("--sampling-topp", type=float, default=-1.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, help="makes sampling repeatable")
    args = parser.parse_args(argv)
    try:
        translator = load_translator(
            args.model_dir, checkpoints=args.checkpoints, data_dir=args.data_dir,
            source_lang=args.source_lang, target_lang=args.target_lang,
            bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model,
            beam=args.beam, lenpen=args.lenpen, batch_size=args.batch_size,
        )
        lines = [line.rstrip("\n") for line in sys.stdin]
        constraints = None
        if args.constraints:
            fields = [line.split("\t") for line in lines]
            lines, constraints = [f[0] for f in fields], [f[1:] for f in fields]
        outputs = translator.translate(
            lines, nbest=args.nbest, beam=args.beam if not args.sampling else None,
            constraints=constraints, unordered_constraints=args.constraints == "unordered",
            sampling=args.sampling, sampling_topk=args.sampling_topk,
            sampling_topp=args.sampling_topp, temperature=args.temperature, seed=args.seed,
        )
    except (UserError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for output in outputs:
        for text in [output] if args.nbest == 1 else output:
            print(text)
    return 0
