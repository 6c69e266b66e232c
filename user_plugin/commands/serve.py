"""Serve a trained model over HTTP, with dynamic batching, limits, and a page to try it.

    vaswani-serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--backend fairseq|ctranslate2]
        [--threads N] [--max-queue N] [--deadline SECONDS] ...

``MODEL_DIR`` is what ``vaswani-translate`` takes (a model directory or, with ``--backend
ctranslate2``, a CTranslate2 export), with the same options to find its files, and the server
translates exactly as ``vaswani-translate`` does. ``POST /translate`` with ``{"text":
["sentence", ...]}`` answers ``{"translations": [...]}``; ``GET /health``, ``GET /model``; the
page at ``/`` translates and draws the encoder-decoder attention. docs/serving.md has the API,
the limits and their answers, batching and shutdown.

SIGTERM or Ctrl-C: stop accepting, answer every accepted request, exit 0. A model that cannot be
loaded, or an address that cannot be listened on: one line ``vaswani-serve: error: ...``, exit 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

# Logging set up before fairseq is imported (see user_plugin.files).
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import UserError, console_script, int_at_least  # noqa: E402
from user_plugin.files.errors import finite_float, int_between  # noqa: E402
from user_plugin.generation.decoding_options import option_type  # noqa: E402
from user_plugin.paper import BEAM, LENPEN  # noqa: E402
from user_plugin.serving.limits import Limits  # noqa: E402

PROG = "vaswani-serve"


#: More intra-op threads than any machine has cores; torch crashes (SIGSEGV) creating ~100,000.
MAX_THREADS = 1024


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = Limits()
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path,
                        help="a model package (or a checkpoint, or a folder holding one), or a "
                        "CTranslate2 export with --backend "
                        "ctranslate2 (as vaswani-translate takes)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int_between(0, 65535), default=8000,
                        help="port to listen on (0: a free one, printed)")
    parser.add_argument("--backend", choices=("fairseq", "ctranslate2"), default="fairseq")
    parser.add_argument("--device", default="cpu",
                        help="where the model runs: cpu, or cuda (cuda:N) when torch sees a GPU "
                        "(default: cpu)")
    model = parser.add_argument_group("the model's files (as vaswani-translate)")
    model.add_argument("--checkpoints", nargs="+", help="several = an ensemble (fairseq)")
    model.add_argument("--data-dir", type=Path, help="the dictionaries (fairseq)")
    model.add_argument("--source-lang")
    model.add_argument("--target-lang")
    model.add_argument("--bpe-codes", type=Path)
    model.add_argument("--sentencepiece-model", type=Path)
    decoding = parser.add_argument_group("decoding (defaults for requests that give none)")
    decoding.add_argument("--beam", type=option_type("beam"), default=BEAM)
    decoding.add_argument("--lenpen", type=option_type("lenpen"), default=LENPEN)
    decoding.add_argument("--batch-size", type=int_at_least(1), default=64,
                          help="sentences per batch of the hub's decoder")
    decoding.add_argument("--threads", type=int_between(0, MAX_THREADS), default=0,
                          help="CPU threads of the decoder (torch intra-op, or CTranslate2's "
                          "intra_threads); 0: the library's default")
    limits = parser.add_argument_group("limits (docs/serving.md)")
    limits.add_argument("--max-body-bytes", type=int_at_least(1),
                        default=defaults.max_body_bytes, help="larger bodies get 413")
    limits.add_argument("--max-sentences", type=int_at_least(1),
                        default=defaults.max_sentences,
                        help="sentences per request; more get 413")
    limits.add_argument("--max-queue", type=int_at_least(1), default=defaults.max_queue,
                        help="sentences waiting for the decoder; a request past it gets 503 "
                        "with Retry-After")
    limits.add_argument("--deadline", type=positive_seconds, default=defaults.deadline,
                        help="seconds from a request's arrival to its answer; later: 504")
    limits.add_argument("--max-beam", type=int_at_least(1), default=defaults.max_beam,
                        help="largest beam a request may ask for (422 beyond)")
    limits.add_argument("--max-batch", type=int_at_least(1),
                        help="most sentences decoded together, at most --batch-size "
                        "(default: --batch-size)")
    limits.add_argument("--batch-wait-ms", type=finite_float,
                        default=defaults.batch_wait * 1000,
                        help="milliseconds an idle decoder waits for more requests to join "
                        "the first")
    limits.add_argument("--max-connections", type=int_at_least(1), default=512,
                        help="connections open at once; more get 503 at once")
    limits.add_argument("--header-timeout", type=positive_seconds, default=10.0,
                        help="seconds a client has to send a request's headers before its "
                        "connection is closed")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    if args.backend == "ctranslate2":
        for name in ("checkpoints", "data_dir"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')} belongs to the fairseq backend: a "
                             "CTranslate2 export holds its model and vocabularies")
    if args.batch_wait_ms < 0:
        parser.error(f"argument --batch-wait-ms: must be >= 0, got {args.batch_wait_ms}")
    if args.beam > args.max_beam:
        parser.error(f"--beam {args.beam} is more than --max-beam {args.max_beam}")
    if args.batch_wait_ms / 1000 >= args.deadline:
        parser.error(f"--batch-wait-ms {args.batch_wait_ms:g} is not shorter than --deadline "
                     f"{args.deadline:g} s: a lone request would wait past its deadline")
    if args.max_batch is None:
        args.max_batch = args.batch_size
    elif args.max_batch > args.batch_size:
        parser.error(f"--max-batch {args.max_batch} is more than --batch-size "
                     f"{args.batch_size}: the server's batch would be decoded as several of "
                     "the decoder's in a row, and requests arriving meanwhile would wait for "
                     "all of them")
    device_problem = checked_device(args.device)
    if device_problem is not None:
        parser.error(f"argument --device: {device_problem}")
    return args


def checked_device(device: str) -> str | None:
    """Why ``device`` cannot run the model here (not cpu, cuda or cuda:N, or a GPU torch does
    not see), or None."""
    import re

    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", device)
    if match is None:
        return f"expected cpu, cuda or cuda:N, got {device!r}"
    if device == "cpu":
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(match.group(1) or 0)
    if index >= count:
        return f"{device}: torch sees {count} CUDA GPU(s) here"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")
    from user_plugin.serving.app import Service, create_app
    from user_plugin.serving.served_model import DecodingOptions, ModelSettings, ServedModel
    from user_plugin.serving.server import bind, run, say, url_of

    limits = Limits(max_body_bytes=args.max_body_bytes, max_sentences=args.max_sentences,
                    max_queue=args.max_queue, deadline=args.deadline, max_beam=args.max_beam,
                    max_batch=args.max_batch, batch_wait=args.batch_wait_ms / 1000)
    if not args.model_dir.exists():
        raise UserError(f"{args.model_dir}: no such file or directory (a model package, a "
                        "checkpoint with --data-dir, or a CTranslate2 export)")
    settings = ModelSettings(
        model_dir=args.model_dir, backend=args.backend,
        checkpoints=None if args.checkpoints is None else tuple(args.checkpoints),
        data_dir=args.data_dir, source_lang=args.source_lang, target_lang=args.target_lang,
        bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model,
        beam=args.beam, lenpen=args.lenpen, batch_size=args.batch_size, threads=args.threads,
        device=args.device,
    )
    sock = bind(args.host, args.port)
    say(f"listening on {url_of(sock)} (loading {args.model_dir}, {args.backend} backend, "
        f"{args.device})")

    def ready(model: ServedModel) -> None:
        codec = model.translator.codec
        say(f"ready: {codec.source_lang}->{codec.target_lang}, model fingerprint "
            f"{model.fingerprint[:16]}")

    def build_app(on_fatal):
        service = Service(lambda: ServedModel.load(settings), limits,
                          DecodingOptions(beam=args.beam, lenpen=args.lenpen),
                          on_load_error=on_fatal, on_ready=ready)
        return create_app(service)

    run(build_app, sock, access_log=args.access_log, max_connections=args.max_connections,
        header_timeout=args.header_timeout)
    say("stopped: every accepted request was answered")
    return 0


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
