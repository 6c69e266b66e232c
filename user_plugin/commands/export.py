"""``vaswani-export MODEL --to fairseq|ctranslate2|transformers --output OUT``: export one of
our models. MODEL is a model package (complete: no other option needed), a checkpoint file with
``--data-dir``, or a folder holding one checkpoint, opened by the one reader
(:func:`~user_plugin.artifacts.model_files.open_model`).

* ``--to fairseq``: OUT is a checkpoint of fairseq's built-in ``transformer``, as stock fairseq
  writes one (its model options an ``argparse.Namespace``), that stock ``fairseq-generate
  DATA_BIN --path OUT``, ``TransformerModel.from_pretrained`` (with the package as its data
  folder) and CTranslate2's ``ct2-fairseq-converter`` load without ``--user-dir``;
* ``--to ctranslate2``: OUT is a CTranslate2 model directory (``--quantization`` int8, float32
  ...), with the vocabularies, the text pipeline's subword model and the language pair, which
  ``load_translator(OUT, backend="ctranslate2")`` and ``vaswani-translate OUT --backend
  ctranslate2`` translate raw text with;
* ``--to transformers``: OUT is a Hugging Face transformers model directory (MarianMTModel or
  FSMTForConditionalGeneration with its tokenizer) that ``from_pretrained`` loads, with the text
  pipeline record for the exact tokenization route.

Bad input (a missing or foreign file, an architecture the target cannot express) is one line
``vaswani-export: error: ...``, status 1, and nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence

from ..files.errors import UserError, console_script

PROG = "vaswani-export"
TARGETS = ("fairseq", "ctranslate2", "transformers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("model", metavar="MODEL", help="a model package, a checkpoint file, or "
                        "a folder holding one checkpoint")
    parser.add_argument("--data-dir", help="the fairseq-preprocess output holding "
                        "dict.<lang>.txt, for a checkpoint outside a package")
    parser.add_argument("--to", required=True, choices=TARGETS, help="the target format")
    parser.add_argument("--output", required=True,
                        help="the checkpoint (--to fairseq) or directory (--to ctranslate2)")
    parser.add_argument("--source-lang", help="default: the checkpoint's or the data dir's")
    parser.add_argument("--target-lang", help="default: the checkpoint's or the data dir's")
    parser.add_argument("--quantization", default=None,
                        help="--to ctranslate2: weight type (int8, int8_float32, int16, "
                        "float16, bfloat16, float32; default: float32)")
    parser.add_argument("--bpe-codes", help="--to ctranslate2/transformers: subword-nmt codes "
                        "to ship, when the model has no text_pipeline.json record "
                        "(default: bpecodes/codes/code beside the checkpoint or in the data dir)")
    parser.add_argument("--sentencepiece-model", help="--to ctranslate2/transformers: "
                        "SentencePiece model "
                        "to ship (default: spm.model/sentencepiece.bpe.model, likewise)")
    parser.add_argument("--no-moses", action="store_true",
                        help="--to ctranslate2/transformers: the text is not Moses-tokenized "
                        "(default: the text pipeline record, else Moses "
                        "unless a SentencePiece model is shipped)")
    return parser


def export(args: argparse.Namespace) -> str:
    """Run the export ``args`` asks for (``args.checkpoint`` and ``args.data_dir`` resolved by
    :func:`main`); the line that says what was written."""
    if args.to == "fairseq":
        from ..export.fairseq_checkpoint import export_fairseq_checkpoint

        for option in ("quantization", "bpe_codes", "sentencepiece_model"):
            if getattr(args, option) is not None:
                raise_usage(f"--{option.replace('_', '-')} is an option of --to ctranslate2")
        path = export_fairseq_checkpoint(args.checkpoint, args.data_dir, args.output,
                                         args.source_lang, args.target_lang)
        return (f"wrote {path}: fairseq's transformer (decode with fairseq-generate "
                f"{shlex.quote(str(args.data_dir))} --path {shlex.quote(str(path))}, no "
                "--user-dir)")
    if args.to == "transformers":
        from ..export.transformers_model import export_transformers

        if args.quantization is not None:
            raise_usage("--quantization is an option of --to ctranslate2")
        exported = export_transformers(
            args.checkpoint, args.data_dir, args.output, source_lang=args.source_lang,
            target_lang=args.target_lang, bpe_codes=args.bpe_codes,
            sentencepiece_model=args.sentencepiece_model,
            moses=False if args.no_moses else None)
        return f"wrote {exported.directory}: {exported.summary}"
    from ..export.ctranslate2_model import export_ctranslate2

    written = export_ctranslate2(
        args.checkpoint, args.data_dir, args.output, quantization=args.quantization,
        source_lang=args.source_lang, target_lang=args.target_lang, bpe_codes=args.bpe_codes,
        sentencepiece_model=args.sentencepiece_model,
        moses=False if args.no_moses else None,
    )
    return f"wrote {written.directory}: {written.summary}"


def raise_usage(message: str) -> None:
    raise UserError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status. Bad input raises a :class:`UserError`
    (:func:`cli_main` prints it as one line, status 1)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    args = build_parser().parse_args(argv)
    from ..registration import register

    register()  # our model and task, safe loading, the checks fairseq's loaders get
    from ..artifacts.errors import ArtifactError
    from ..artifacts.model_files import open_model
    from ..files.atomic import refuse_input_clash

    files = open_model(args.model, data_dir=args.data_dir, bpe_codes=args.bpe_codes,
                       sentencepiece_model=args.sentencepiece_model)
    if len(files.checkpoints) > 1:
        raise ArtifactError(f"{args.model} is an ensemble of {len(files.checkpoints)} models: "
                            "an export holds one (export each checkpoint)")
    # everything the export reads: an output never is, holds or lies inside one of them, nor
    # is a training checkpoint (a file for --to fairseq, a directory written whole otherwise)
    refuse_input_clash(args.output, [args.model, *files.checkpoints, files.data_dir,
                                     *files.inputs()])
    args.checkpoint, args.data_dir = files.checkpoints[0], files.data_dir
    if files.manifest is not None:  # a package says its languages, checked against its model
        files.read_states()
        args.source_lang, args.target_lang = files.language_pair(None, args.source_lang,
                                                                 args.target_lang)
    print(f"exporting {args.model} to {args.to} ({args.output})", file=sys.stderr)
    print(export(args), file=sys.stderr)
    return 0


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
