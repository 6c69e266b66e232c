"""Text preparation helpers that the WMT14 recipes call (paper §5.1, "Training Data and Batching").

The paper trains on WMT14 EN-DE (about 4.5M sentence pairs, byte-pair encoded) and WMT14 EN-FR
(36M pairs, 32k word pieces). Before the subword step the raw text goes through the usual Moses
pipeline; this script provides each stage as a subcommand, streaming and line-aligned:

* ``normalize``: Moses punctuation normalisation and (unless ``--no-tokenize``) Moses
  tokenisation with sacremoses (aggressive hyphen splitting, no XML escaping);
* ``clean``: drop training pairs with an empty or over-long side or a too-skewed length ratio
  (the ``clean-corpus-n`` rule: 1..250 tokens, ratio 1.5);
* ``check-lines``: all files have the same (optionally an expected) number of lines;
* ``sgm-to-text``: the segments of a WMT ``.sgm`` file, one per line;
* ``spm-train`` / ``spm-encode``: a SentencePiece model and its pieces (the EN-FR word pieces);
* ``extract-hypotheses``: fairseq-generate's ``H-`` lines in the original sentence order;
* ``detokenize``: Moses detokenisation of the hypotheses before scoring (``--subwords``
  joins BPE or SentencePiece pieces first);
* ``write-pipeline``: the record of the text pipeline the data was prepared with
  (``text_pipeline.json``, with the subword model's sha256), which travels with the model;
* ``encode``: raw text -> model tokens by such a record, as the hub and the exports encode it.

The normalisation and tokenisation are those of
:class:`user_plugin.artifacts.text_pipeline.TextPipeline` (its ``recipe`` settings): the one
definition of the text pipeline that the hub, CTranslate2 and the exports also run.

Lines end at LF only, in every subcommand (the rule of ``user_plugin.files.text`` and of
``wc -l``): a stray CR, form feed, NEL or U+2028 inside a sentence never changes a line count
or the alignment of two sides; ``normalize`` turns them, like tabs, into spaces.

Every output is written to a temporary file next to it and moved into place, so an interrupted
run never leaves a truncated file behind. Bad input gives one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from multiprocessing import Pool
from pathlib import Path

# Logging set up before fairseq is imported (see user_plugin.files).
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.artifacts.text_pipeline import TextPipeline  # noqa: E402
from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write,
    console_script,
    file_error,
    first_line,
    int_at_least,
    iter_lines,
    make_temp_dir,
    single_line,
)

CHUNK_LINES = 2000
SEG_PATTERN = re.compile(r"<seg[^>]*>(.*)</seg>")


# ---------------------------------------------------------------------------------------------
# Reading and writing line-aligned text


def write_lines(path: Path, lines: Iterable[str], inputs: Sequence[Path] = ()) -> int:
    """Write ``lines`` (one per line, atomically) to ``path``, never onto one of ``inputs``;
    return how many were written."""
    count = 0

    def write(temp: str) -> None:
        nonlocal count
        with open(temp, "w", encoding="utf-8", newline="\n") as handle:
            for line in lines:
                handle.write(line + "\n")
                count += 1

    atomic_write(Path(path), write, inputs)
    return count


def count_lines(path: Path) -> int:
    """Number of lines of a file by the project's rule (``\\n`` ends a line, nothing else; a
    last line without ``\\n`` counts too)."""
    try:
        with open(path, "rb") as handle:
            count, last = 0, b""
            while True:
                block = handle.read(1 << 20)
                if not block:
                    break
                count += block.count(b"\n")
                last = block[-1:]
    except OSError as error:
        raise file_error(path, error, expected="a text file") from None
    return count + (1 if last not in (b"", b"\n") else 0)


def chunks(lines: Iterable[str], size: int = CHUNK_LINES) -> Iterator[list[str]]:
    """Consecutive lists of at most ``size`` lines."""
    iterator = iter(lines)
    while True:
        block = list(islice(iterator, size))
        if not block:
            return
        yield block


def map_in_windows(pool, function: Callable[[list[str]], list[str]], lines: Iterable[str],
                   workers: int) -> Iterator[str]:
    """``function`` over chunks of ``lines`` in the pool's processes, in order, reading only a
    few chunks per worker ahead (a WMT corpus never has to fit in memory)."""
    window = []
    for block in chunks(lines):
        window.append(block)
        if len(window) == 4 * workers:
            for result in pool.map(function, window):
                yield from result
            window = []
    for result in pool.map(function, window):
        yield from result


# ---------------------------------------------------------------------------------------------
# Normalisation and tokenisation (sacremoses)

_WORKER_STATE: dict[str, object] = {}


def _init_worker(lang: str, tokenize: bool) -> None:
    _WORKER_STATE["pipeline"] = TextPipeline.recipe(
        lang, lang, "bpe" if tokenize else "sentencepiece")


def _process_chunk(block: list[str]) -> list[str]:
    pipeline: TextPipeline = _WORKER_STATE["pipeline"]  # type: ignore[assignment]
    return [pipeline.pretokenize(line) for line in block]


def normalize_lines(lines: Iterable[str], lang: str, tokenize: bool = True,
                    workers: int = 1) -> Iterator[str]:
    """The recipes' text pipeline before the subword step (:class:`TextPipeline.recipe`: Moses
    punctuation normalisation, then, unless ``tokenize`` is off, Moses tokenisation with
    aggressive dash splits and no escaping), keeping the order of ``lines``.

    One output line per input line, always (an empty line stays empty), so the two sides of a
    parallel corpus stay aligned. ``workers > 1`` tokenises chunks in parallel processes.
    """
    if workers <= 1:
        _init_worker(lang, tokenize)
        for block in chunks(lines):
            yield from _process_chunk(block)
        return
    with Pool(workers, initializer=_init_worker, initargs=(lang, tokenize)) as pool:
        yield from map_in_windows(pool, _process_chunk, lines, workers)


#: ``detokenize --subwords``: the subword methods whose pieces can be joined first.
SUBWORD_CHOICES = ("none", "bpe", "sentencepiece")


def detokenize_lines(lines: Iterable[str], lang: str, subwords: str = "none") -> Iterator[str]:
    """Undo Moses tokenisation (joins ``@-@`` hyphens, re-attaches punctuation). With
    ``subwords`` ``bpe`` or ``sentencepiece``, the subword pieces are joined first, as the
    recipes' text pipeline decodes a model's output (:meth:`TextPipeline.decode`: BPE text is
    then Moses-detokenized; SentencePiece text was never Moses-tokenized and is only joined)."""
    if subwords != "none":
        pipeline = TextPipeline.recipe(lang, lang, subwords)
        for line in lines:
            yield pipeline.decode(line)
        return
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=lang)
    for line in lines:
        yield single_line(detokenizer.detokenize(line.split(), return_str=True))


# ---------------------------------------------------------------------------------------------
# Cleaning by length and ratio


def keep_pair(src: str, tgt: str, min_len: int, max_len: int, ratio: float) -> bool:
    """The ``clean-corpus-n`` rule: both sides have ``min_len..max_len`` tokens and neither is
    more than ``ratio`` times longer than the other (tokens are whitespace-separated)."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if not (min_len <= n_src <= max_len and min_len <= n_tgt <= max_len):
        return False
    return n_src <= ratio * n_tgt and n_tgt <= ratio * n_src


def clean_pairs(pairs: Iterable[tuple[str, str]], min_len: int, max_len: int,
                ratio: float) -> Iterator[tuple[str, str]]:
    """The pairs that :func:`keep_pair` keeps, in order."""
    for src, tgt in pairs:
        if keep_pair(src, tgt, min_len, max_len, ratio):
            yield src, tgt


def zip_aligned(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Line pairs of two files; an error (naming both) when one ends before the other."""
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    sentinel = object()
    index = 0
    while True:
        src, tgt = next(src_lines, sentinel), next(tgt_lines, sentinel)
        if src is sentinel and tgt is sentinel:
            return
        if src is sentinel or tgt is sentinel:
            short = src_path if src is sentinel else tgt_path
            raise UserError(f"{src_path} and {tgt_path} are not aligned: "
                            f"{short} ends after {index} lines")
        index += 1
        yield src, tgt  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# WMT test sets and fairseq-generate output


def sgm_segments(lines: Iterable[str]) -> Iterator[str]:
    """The text of every ``<seg ...>TEXT</seg>`` line, trimmed, whitespace runs made one space."""
    for line in lines:
        if line.lstrip().startswith("<seg"):
            match = SEG_PATTERN.search(line)
            if match is None:
                raise UserError(f"unterminated <seg> element: {line[:60]!r}")
            yield single_line(match.group(1))


def refuse_several_runs(lines: Sequence[str]) -> None:
    """A :class:`UserError` when a fairseq-generate log holds more than one run: a sentence's
    source line (``S-<id>``, one per sentence in a run) appears twice, as in a log appended to
    with ``>>``, or a complete run followed by a killed one. Their hypotheses would be mixed
    without a word; a run that did not finish lacks hypotheses, which the count refuses."""
    seen: dict[str, int] = {}
    for line in lines:
        if line.startswith("S-"):
            sentence = line.split("\t", 1)[0][2:]
            seen[sentence] = seen.get(sentence, 0) + 1
            if seen[sentence] > 1:
                raise UserError(
                    f"holds more than one run of fairseq-generate (sentence {sentence} is "
                    "translated again: a log appended to with >>, or a run followed by another): "
                    "give the log of one complete run")


def parse_hypotheses(lines: Iterable[str], expected: int) -> list[str]:
    """The best hypothesis of each sentence from fairseq-generate's ``H-<id>\\t<score>\\t<text>``
    lines, in the order of the ids ``0..expected-1``; an error when any id is missing. Output
    without ``H-`` lines (``grep '^D-'`` of a log) is read from its ``D-`` lines (the
    detokenized hypotheses, same layout)."""
    lines = list(lines)
    refuse_several_runs(lines)
    kind = "H-" if any(line.startswith("H-") for line in lines) else "D-"
    by_id: dict[int, str] = {}
    for line in lines:
        if not line.startswith(kind):
            continue
        fields = line.split("\t")
        try:
            sentence_id = int(fields[0][2:])
            float(fields[1])
        except (ValueError, IndexError):
            raise UserError(f"malformed hypothesis line: {line[:60]!r}") from None
        by_id.setdefault(sentence_id, fields[2] if len(fields) > 2 else "")
    missing = [i for i in range(expected) if i not in by_id]
    extra = sorted(i for i in by_id if not 0 <= i < expected)
    if missing or extra:
        detail = f"{len(missing)} of {expected} sentences have no hypothesis"
        if missing:
            detail += f" (first missing id {missing[0]})"
        if extra:
            detail += f", {len(extra)} ids out of range"
        raise UserError(detail)
    return [by_id[i] for i in range(expected)]


# ---------------------------------------------------------------------------------------------
# SentencePiece (the EN-FR word pieces)


def spm_train(inputs: Sequence[Path], model_prefix: Path, vocab_size: int, model_type: str,
              character_coverage: float, input_sentence_size: int) -> None:
    """Train a SentencePiece model on ``inputs``; write ``<prefix>.model`` and ``.vocab``
    (each moved into place only once both exist)."""
    import sentencepiece as spm

    for path in inputs:
        if count_lines(path) == 0:
            raise UserError(f"{path}: empty, cannot train SentencePiece on it")
    model_prefix = Path(model_prefix)
    temp_dir = make_temp_dir(model_prefix)
    temp_prefix = temp_dir / model_prefix.name
    try:
        try:
            spm.SentencePieceTrainer.train(
                input=",".join(str(p) for p in inputs),
                model_prefix=str(temp_prefix),
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                hard_vocab_limit=False,
                minloglevel=2,
            )
        except (RuntimeError, OSError) as error:
            raise UserError(f"SentencePiece training failed: {first_line(error)}") from None
        for suffix in (".model", ".vocab"):
            try:
                os.replace(f"{temp_prefix}{suffix}", f"{model_prefix}{suffix}")
            except OSError as error:
                raise file_error(f"{model_prefix}{suffix}", error, writing=True) from None
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _init_spm_worker(model: str) -> None:
    import sentencepiece as spm

    _WORKER_STATE["spm"] = spm.SentencePieceProcessor(model_file=model)


def _encode_chunk(block: list[str]) -> list[str]:
    processor = _WORKER_STATE["spm"]
    return [" ".join(pieces) for pieces in processor.encode(block, out_type=str)]


def spm_encode_lines(lines: Iterable[str], model: Path, workers: int = 1) -> Iterator[str]:
    """The SentencePiece pieces of each line, space-separated, in order."""
    if not Path(model).is_file():
        raise UserError(f"{model}: no such SentencePiece model")
    if workers <= 1:
        _init_spm_worker(str(model))
        for block in chunks(lines):
            yield from _encode_chunk(block)
        return
    with Pool(workers, initializer=_init_spm_worker, initargs=(str(model),)) as pool:
        yield from map_in_windows(pool, _encode_chunk, lines, workers)


# ---------------------------------------------------------------------------------------------
# Subcommands


def cmd_normalize(args: argparse.Namespace) -> int:
    written = write_lines(args.output, normalize_lines(iter_lines(args.input), args.lang,
                                                       not args.no_tokenize, args.workers),
                          [args.input])
    action = "normalised" if args.no_tokenize else "normalised and tokenised"
    print(f"{action} {written} lines: {args.input} -> {args.output}", file=sys.stderr)
    return 0


def cmd_detokenize(args: argparse.Namespace) -> int:
    written = write_lines(args.output, detokenize_lines(iter_lines(args.input), args.lang,
                                                       args.subwords), [args.input])
    joined = "" if args.subwords == "none" else f" ({args.subwords} pieces joined)"
    print(f"detokenised {written} lines{joined}: {args.input} -> {args.output}", file=sys.stderr)
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    if args.min_len < 0 or args.max_len < args.min_len or args.ratio < 1:
        raise UserError("need 0 <= --min-len <= --max-len and --ratio >= 1")
    counts = {"total": 0, "kept": 0}

    def write_both(src_temp: str) -> None:
        def write_tgt(tgt_temp: str) -> None:
            with open(src_temp, "w", encoding="utf-8", newline="\n") as src_handle, \
                    open(tgt_temp, "w", encoding="utf-8", newline="\n") as tgt_handle:
                for src, tgt in zip_aligned(args.src_in, args.tgt_in):
                    counts["total"] += 1
                    if keep_pair(src, tgt, args.min_len, args.max_len, args.ratio):
                        counts["kept"] += 1
                        src_handle.write(src + "\n")
                        tgt_handle.write(tgt + "\n")
            if counts["total"] and not counts["kept"]:  # nothing written: nothing to train on
                raise UserError(
                    f"none of the {counts['total']} pairs of {args.src_in} has {args.min_len}.."
                    f"{args.max_len} tokens per side and a length ratio <= {args.ratio}: "
                    "nothing to train on (widen MIN_LEN/MAX_LEN, --min-len/--max-len)")

        atomic_write(args.tgt_out, write_tgt)

    atomic_write(args.src_out, write_both)
    n_kept, total = counts["kept"], counts["total"]
    print(f"kept {n_kept} of {total} pairs ({args.min_len}..{args.max_len} tokens, "
          f"ratio <= {args.ratio}): {args.src_out}, {args.tgt_out}", file=sys.stderr)
    return 0


def cmd_check_lines(args: argparse.Namespace) -> int:
    counts = {str(path): count_lines(path) for path in args.files}
    values = set(counts.values())
    if len(values) != 1:
        listing = ", ".join(f"{path}: {n}" for path, n in counts.items())
        raise UserError(f"line counts differ ({listing})")
    (count,) = values
    if count == 0 and not args.allow_empty:
        raise UserError(f"{', '.join(counts)}: no lines")
    if args.expected is not None and count != args.expected:
        raise UserError(f"{', '.join(counts)}: {count} lines, expected {args.expected}")
    print(count)
    return 0


def cmd_sgm_to_text(args: argparse.Namespace) -> int:
    written = write_lines(args.output, sgm_segments(iter_lines(args.input)), [args.input])
    if written == 0:
        raise UserError(f"{args.input}: no <seg> elements found")
    print(f"extracted {written} segments: {args.input} -> {args.output}", file=sys.stderr)
    return 0


def cmd_extract_hypotheses(args: argparse.Namespace) -> int:
    try:
        hypotheses = parse_hypotheses(iter_lines(args.generate_output), args.expected)
    except UserError as error:
        raise UserError(f"{args.generate_output}: {error}") from None
    write_lines(args.output, hypotheses, [args.generate_output])
    print(f"extracted {len(hypotheses)} hypotheses in source order -> {args.output}",
          file=sys.stderr)
    return 0


def cmd_spm_train(args: argparse.Namespace) -> int:
    spm_train(args.inputs, args.model_prefix, args.vocab_size, args.model_type,
              args.character_coverage, args.input_sentence_size)
    print(f"trained SentencePiece ({args.model_type}, {args.vocab_size} pieces) -> "
          f"{args.model_prefix}.model", file=sys.stderr)
    return 0


def cmd_spm_encode(args: argparse.Namespace) -> int:
    written = write_lines(args.output,
                          spm_encode_lines(iter_lines(args.input), args.model, args.workers),
                          [args.input, args.model])
    print(f"encoded {written} lines: {args.input} -> {args.output}", file=sys.stderr)
    return 0



def cmd_write_pipeline(args: argparse.Namespace) -> int:
    pipeline = TextPipeline.recipe(args.source_lang, args.target_lang, args.subword, args.model)
    path = pipeline.write(args.output)
    print(f"text pipeline ({pipeline.describe()}) -> {path}", file=sys.stderr)
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    pipeline = TextPipeline.load(args.pipeline)
    note = pipeline.normalization_note(args.pipeline)
    if note is not None:
        print(note, file=sys.stderr)
    written = write_lines(args.output, pipeline.encode_lines(iter_lines(args.input),
                                                             target=args.target))
    print(f"encoded {written} lines ({pipeline.describe()}): {args.input} -> {args.output}",
          file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    workers_help = "parallel processes (default: 1)"

    p = sub.add_parser("normalize", help="Moses punctuation normalisation + tokenisation")
    p.add_argument("--lang", required=True)
    p.add_argument("--no-tokenize", action="store_true", help="normalise punctuation only")
    p.add_argument("--workers", type=int_at_least(1), default=1, help=workers_help)
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_normalize)

    p = sub.add_parser("detokenize", help="Moses detokenisation")
    p.add_argument("--lang", required=True)
    p.add_argument("--subwords", choices=SUBWORD_CHOICES, default="none",
                   help="join these subword pieces first: bpe ('@@ ' joiners, then Moses "
                   "detokenisation) or sentencepiece ('\u2581' pieces, joined only)")
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_detokenize)

    p = sub.add_parser("clean", help="drop pairs by length and length ratio")
    p.add_argument("--src-in", type=Path, required=True)
    p.add_argument("--tgt-in", type=Path, required=True)
    p.add_argument("--src-out", type=Path, required=True)
    p.add_argument("--tgt-out", type=Path, required=True)
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len", type=int, default=250)
    p.add_argument("--ratio", type=float, default=1.5)
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("check-lines", help="files have equal (and expected) line counts")
    p.add_argument("--expected", type=int, default=None)
    p.add_argument("--allow-empty", action="store_true")
    p.add_argument("files", type=Path, nargs="+")
    p.set_defaults(func=cmd_check_lines)

    p = sub.add_parser("sgm-to-text", help="segments of a WMT .sgm file")
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_sgm_to_text)

    p = sub.add_parser("extract-hypotheses", help="fairseq-generate H- lines in source order")
    p.add_argument("--expected", type=int, required=True, help="number of test sentences")
    p.add_argument("generate_output", type=Path)
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_extract_hypotheses)

    p = sub.add_parser("spm-train", help="train a SentencePiece model")
    p.add_argument("--model-prefix", type=Path, required=True)
    p.add_argument("--vocab-size", type=int_at_least(1), default=32000)
    p.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char", "word"])
    p.add_argument("--character-coverage", type=float, default=1.0)
    p.add_argument("--input-sentence-size", type=int, default=10_000_000,
                   help="sentences sampled for training (0: all)")
    p.add_argument("inputs", type=Path, nargs="+")
    p.set_defaults(func=cmd_spm_train)

    p = sub.add_parser("spm-encode", help="SentencePiece pieces, space-separated")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--workers", type=int_at_least(1), default=1, help=workers_help)
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_spm_encode)

    p = sub.add_parser("write-pipeline", help="the text pipeline record of the prepared data")
    p.add_argument("--source-lang", required=True)
    p.add_argument("--target-lang", required=True)
    p.add_argument("--subword", required=True, choices=["bpe", "sentencepiece"])
    p.add_argument("--model", type=Path, required=True, help="the BPE codes / SentencePiece "
                   "model (named in the record with its sha256; keep it beside the record)")
    p.add_argument("--output", type=Path, required=True, help="the record (JSON) to write")
    p.set_defaults(func=cmd_write_pipeline)

    p = sub.add_parser("encode", help="raw text -> model tokens by a text pipeline record")
    p.add_argument("--pipeline", type=Path, required=True, help="text_pipeline.json")
    p.add_argument("--target", action="store_true", help="the lines are target-side text")
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_encode)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    return command(args)


PROG = "vaswani-prepare-text"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
