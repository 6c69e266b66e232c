"""``vaswani-translate MODEL``: translate stdin line by line to stdout.

MODEL is a model package (the recipes' ``$RUN_DIR/model``, or ``vaswani-package``'s output), a
checkpoint file with ``--data-dir``, or a folder holding one checkpoint; a CTranslate2 export
with ``--backend ctranslate2`` (:func:`~user_plugin.artifacts.model_files.open_model`).

Decoding is the paper's (beam 4, GNMT alpha 0.6, source + 50) unless options say otherwise:
``--nbest`` prints that many translations per input line (one per output line), ``--sampling``
(with ``--sampling-topk``, ``--sampling-topp``, ``--temperature``, ``--seed``) draws samples,
and ``--constraints`` reads each input line as ``source<TAB>phrase<TAB>phrase...`` (as
``fairseq-interactive --constraints`` does), the phrases being raw target text the translation
must contain.

``--print-tokens`` prints, per input line, the model tokens the line becomes (the model's text
pipeline, then ``<unk>`` for tokens outside the source vocabulary), for either backend, without
translating: what the model gets.

Standard input is read by the project's line rule (only LF ends a line, as ``wc -l`` counts):
one output line per input line, whatever CR, form feed, NEL or U+2028 a sentence holds. Input
that is not UTF-8 is refused with one line before anything is translated. Bad input is one line
``vaswani-translate: error: ...`` and status 1 (argparse's usage errors: status 2).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import IO

from ..files.errors import UserError, console_script, file_error
from ..files.standard_streams import CLOSED_INPUT, input_is_closed, silence_stdout
from ..files.text import BYTE_ORDER_MARK, decode_lines, split_lines
from ..generation.decoding_options import option_type
from ..hub.loader import load_translator
from ..paper import BEAM, LENPEN

PROG = "vaswani-translate"


def read_input_lines(stream: IO) -> list[str]:
    """The lines of ``stream`` (standard input) by the project's line rule, decoded as UTF-8
    from its bytes when it has them; a :class:`UserError` when they are not UTF-8. A
    byte-order mark at the start is dropped, from bytes and from text alike."""
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        return decode_lines(binary.read(), "standard input")
    return split_lines(stream.read().removeprefix(BYTE_ORDER_MARK))


def main(argv: Sequence[str] | None = None) -> int:
    """``vaswani-translate MODEL``: translate stdin, one sentence per line. Returns the exit
    status; bad input raises a :class:`UserError` (:func:`cli_main` prints it as one line)."""
    parser = argparse.ArgumentParser(prog=PROG, description=main.__doc__.split(". ")[0])
    parser.add_argument("model_dir", metavar="MODEL",
                        help="a model package, a checkpoint file, or a folder holding one")
    parser.add_argument("--checkpoints", nargs="+",
                        help="the checkpoints of a folder holding several (several: an ensemble)")
    parser.add_argument("--data-dir", help="the folder of the dictionaries, for a checkpoint "
                        "that is not in a package")
    parser.add_argument("--source-lang")
    parser.add_argument("--target-lang")
    parser.add_argument("--bpe-codes")
    parser.add_argument("--sentencepiece-model")
    parser.add_argument("--beam", type=option_type("beam"), default=BEAM)
    parser.add_argument("--lenpen", type=option_type("lenpen"), default=LENPEN,
                        help="alpha of the GNMT length penalty, from 0 to 10")
    parser.add_argument("--nbest", type=option_type("nbest"), default=1)
    parser.add_argument("--batch-size", type=option_type("batch_size"), default=64)
    parser.add_argument("--constraints", nargs="?", const="ordered",
                        choices=("ordered", "unordered"),
                        help="input lines are source<TAB>phrase<TAB>...; the translation "
                        "contains every phrase (in order unless 'unordered')")
    parser.add_argument("--sampling", action="store_true",
                        help="sample --nbest translations instead of beam search")
    parser.add_argument("--sampling-topk", type=option_type("sampling_topk"), default=-1)
    parser.add_argument("--sampling-topp", type=option_type("sampling_topp"), default=-1.0)
    parser.add_argument("--temperature", type=option_type("temperature"), default=1.0)
    parser.add_argument("--seed", type=option_type("seed"), help="makes sampling repeatable")
    parser.add_argument("--backend", choices=("fairseq", "ctranslate2"), default="fairseq",
                        help="ctranslate2: MODEL_DIR is an export of vaswani-export --to "
                        "ctranslate2")
    parser.add_argument("--print-tokens", action="store_true",
                        help="print, per input line, the model tokens it is fed (the text "
                        "pipeline's tokens, <unk> for those outside the vocabulary) instead of "
                        "translating")
    args = parser.parse_args(argv)
    if args.nbest > args.beam and not args.sampling:
        parser.error(f"argument --nbest: must be at most --beam {args.beam} (the hypotheses "
                     f"a search keeps), got {args.nbest}")
    # stderr carries warnings and errors only: fairseq sets up logging at INFO when imported,
    # and its batch iterator asks for pinned memory, which torch warns about on a CPU
    logging.getLogger().setLevel(logging.WARNING)
    if input_is_closed():
        raise UserError(CLOSED_INPUT)
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")
    try:
        translator = load_translator(
            args.model_dir, checkpoints=args.checkpoints, data_dir=args.data_dir,
            source_lang=args.source_lang, target_lang=args.target_lang,
            bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model,
            beam=args.beam, lenpen=args.lenpen, batch_size=args.batch_size,
            backend=args.backend,
        )
        lines = read_input_lines(sys.stdin)
        if args.print_tokens:
            outputs, nbest = translator.model_tokens(lines), 1
        else:
            outputs, nbest = translate_lines(translator, lines, args), args.nbest
    except ValueError as exc:  # the translator's refusal of an option or a sentence
        raise UserError(str(exc)) from None
    return write_output(outputs, nbest)


def translate_lines(translator, lines: list[str], args: argparse.Namespace) -> list:
    """The translations of ``lines`` with the decoding options of ``args``; with
    ``--constraints``, each line is ``source<TAB>phrase<TAB>...``."""
    constraints = None
    if args.constraints:
        fields = [line.split("\t") for line in lines]
        lines, constraints = [f[0] for f in fields], [f[1:] for f in fields]
    return translator.translate(
        lines, nbest=args.nbest, beam=args.beam if not args.sampling else None,
        constraints=constraints, unordered_constraints=args.constraints == "unordered",
        sampling=args.sampling, sampling_topk=args.sampling_topk,
        sampling_topp=args.sampling_topp, temperature=args.temperature, seed=args.seed,
    )


def write_output(outputs: Sequence, nbest: int) -> int:
    """Write ``outputs`` (one string, or ``nbest`` strings, per input line) to stdout; the exit
    status. A :class:`UserError` when stdout cannot be written (a full disk); a reader that
    went away ends the command quietly (:mod:`~user_plugin.files.standard_streams`)."""
    try:
        for output in outputs:
            for text in [output] if nbest == 1 else output:
                sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as error:
        silence_stdout()
        raise file_error("standard output", error, writing=True) from None
    return 0


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
