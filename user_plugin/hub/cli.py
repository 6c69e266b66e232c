"""``python -m user_plugin.hub MODEL_DIR``: translate stdin line by line to stdout."""

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
    parser.add_argument("--backend", choices=("fairseq", "ctranslate2"), default="fairseq",
                        help="ctranslate2: MODEL_DIR is an export of python -m "
                        "user_plugin.export --to ctranslate2")
    args = parser.parse_args(argv)
    try:
        translator = load_translator(
            args.model_dir, checkpoints=args.checkpoints, data_dir=args.data_dir,
            source_lang=args.source_lang, target_lang=args.target_lang,
            bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model,
            beam=args.beam, lenpen=args.lenpen, batch_size=args.batch_size,
            backend=args.backend,
        )
        lines = [line.rstrip("\n") for line in sys.stdin]
        outputs = translator.translate(lines, nbest=args.nbest)
    except (UserError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for output in outputs:
        for text in [output] if args.nbest == 1 else output:
            print(text)
    return 0
