"""One line, with the right cause, for the errors fairseq raises on bad input.

fairseq reports several user mistakes with a traceback whose last line does not say what to
change: an ``AssertionError`` for a ``--max-tokens`` below the longest sentence (and for each
usage check of its commands' own code, such as a missing ``--path``), a
``FileNotFoundError`` for a language the data directory has no dictionary of, two chained
tracebacks for a checkpoint trained with another layout (``--encoder-normalize-before``...).
:func:`one_line_cause` recognises them by their type and message (nothing of fairseq is
imported) and words the line; :func:`one_line_excepthook` prints
it instead of the traceback, in every command that loads the plugin. An error it does not
recognise keeps its traceback: a bug must stay visible.

Any ``OSError`` about a named file that nothing caught (a data directory that does not exist,
a file that cannot be read) is a file problem of the user's: it becomes the project's line for
it (:func:`~user_plugin.files.errors.file_error`).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

from ..files.errors import (
    InvalidValue,
    UserError,
    end_by_interrupt,
    file_error,
    interrupted_line,
)
from ..files.standard_streams import encoding_problem, silence_stdout

_MAX_TOKENS = re.compile(r"Sentences lengths should not exceed max_tokens=(\d+)")
_DICTIONARY = re.compile(r"dict\.(?P<lang>[^./]+)\.txt")
_ARCHITECTURE = re.compile(r"Cannot load model parameters from checkpoint (?P<path>.+?); "
                           r"please ensure that the architectures match")


def _state_dict_reason(error: BaseException | None) -> str:
    """The first difference that torch's ``load_state_dict`` reported, shortened."""
    if error is None:
        return "its parameters differ"
    for line in str(error).splitlines():
        line = line.strip()
        if line.startswith(("Missing key(s)", "Unexpected key(s)", "size mismatch")):
            keys = re.findall(r'"([^"]+)"', line)
            kind = line.split(" in state_dict")[0].split(" for ")[0].lower()
            if keys:
                more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
                return f"{kind}: {keys[0]}{more}"
            return line[:200]
    return "its parameters differ"


def _trained_arch(path: str) -> str | None:
    """The ``--arch`` the checkpoint ``path`` was trained with, read from its configuration
    without building anything, or None."""
    from ..artifacts.fingerprint import architecture_name
    from ..files.training_state import checkpoint_entries

    entries = checkpoint_entries(path) or {}
    cfg, args = entries.get("cfg"), entries.get("args")
    model = cfg.get("model") if isinstance(cfg, dict) else None
    return architecture_name(model if isinstance(model, dict) else args)


def _languages(directory: Path) -> str:
    found = sorted(match.group("lang") for path in directory.glob("dict.*.txt")
                   if (match := _DICTIONARY.fullmatch(path.name)))
    return ", ".join(found) if found else "none"


def _raised_by_fairseq_command(error: BaseException) -> bool:
    """Whether ``error`` was raised by the code of a fairseq command itself
    (``fairseq_cli/*.py``), whose assertions that name an option are its usage checks
    (``--path required for generation!``, ``--batch-size cannot be larger than
    --buffer-size``...)."""
    frames = error.__traceback__
    while frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    return frames is not None and Path(frames.tb_frame.f_code.co_filename).parent.name == (
        "fairseq_cli")


def _raised_reading_interactive_input(error: BaseException) -> bool:
    """Whether ``error`` was raised while ``fairseq-interactive`` read its input through
    ``fileinput`` (``--input`` as UTF-8, or standard input, which our task's runs read
    strictly): a decoding error that names no file."""
    files = []
    frames = error.__traceback__
    while frames is not None:
        files.append(Path(frames.tb_frame.f_code.co_filename).as_posix())
        frames = frames.tb_next
    return any(name.endswith("fairseq_cli/interactive.py") for name in files) and \
        any(name.endswith("/fileinput.py") for name in files)


def one_line_cause(error: BaseException) -> str | None:
    """The one-line message for an error fairseq raised on bad input, or None when ``error``
    is not one of those (it then keeps its traceback)."""
    message = str(error)
    if isinstance(error, UnicodeDecodeError) and _raised_reading_interactive_input(error):
        return (f"the input is not valid UTF-8 text (byte 0x{error.object[error.start]:02x} "
                "cannot start or continue a character): give UTF-8 text")
    if isinstance(error, AssertionError):
        match = _MAX_TOKENS.search(message)
        if match:
            return (f"a sentence is longer than --max-tokens {match.group(1)} (the tokens of "
                    "one batch), so it fits in no batch: raise --max-tokens above the longest "
                    "sentence, or give --skip-invalid-size-inputs-valid-test to skip such "
                    "sentences with a count")
        if "--" in message and _raised_by_fairseq_command(error):
            return message.rstrip("!")
        return None
    if isinstance(error, OSError) and error.filename is not None:
        path = Path(str(error.filename))
        match = _DICTIONARY.fullmatch(path.name)
        if isinstance(error, FileNotFoundError) and match and path.parent.is_dir():
            return (f"{path.parent} has no {path.name}: it holds no {match.group('lang')} data "
                    f"(its dictionaries' languages: {_languages(path.parent)}); check "
                    "--source-lang and --target-lang")
        if isinstance(error, FileNotFoundError):
            return f"{path}: no such file or directory"
        return str(file_error(path, error))
    match = _ARCHITECTURE.search(message)
    if match:
        cause = error.__cause__ or error.__context__
        arch = _trained_arch(match.group("path"))
        trained = f"was trained with --arch {arch}; " if arch else ""
        give = f"--arch {arch} and " if arch else ""
        return (f"{match.group('path')}: {trained}its parameters do not fit the model built "
                f"from the options given ({_state_dict_reason(cause)}): give {give}the "
                "architecture options it was trained with (such as --encoder-normalize-before), "
                "or use another --save-dir to train a new model")
    return None


def checked_batch_by_size(batch_by_size: Callable) -> Callable:
    """fairseq's ``data_utils.batch_by_size``, refusing a limit below 1 (``max_tokens`` or
    ``max_sentences``; None is no limit) with an :class:`~user_plugin.files.errors.InvalidValue`
    naming the option: fairseq's own batching fails on one with an ``IndexError``."""

    def batch(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
              *args, **kwargs):
        for value, option in ((max_tokens, "--max-tokens"), (max_sentences, "--batch-size")):
            if value is not None and value < 1:
                raise InvalidValue(f"{option} (or {option}-valid) must be at least 1, or unset "
                                   f"for no limit; got {value}")
        return batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                             *args, **kwargs)

    return batch


def one_line_excepthook(previous: Callable) -> Callable:
    """``sys.excepthook`` that reports a :class:`UserError` nothing caught as
    ``prog: error: ...`` (one line, exit status 1) instead of a traceback, and likewise the
    errors fairseq raises on bad input that :func:`one_line_cause`
    recognises; an interrupt (Ctrl-C) is one line saying what was left
    (:func:`~user_plugin.files.errors.interrupted_line`: a training run's last checkpoint and
    how to resume); standard output's reader gone is a quiet end, and its encoding unable to
    hold the text one line (:mod:`~user_plugin.files.standard_streams`); other exceptions go to
    ``previous``, with their traceback. The plugin
    installs it (:mod:`user_plugin.fairseq_patches`) in every command that loads it
    (fairseq's ``fairseq-train``, ``fairseq-generate``...)."""

    def hook(kind, error, traceback) -> None:
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        if isinstance(error, KeyboardInterrupt):
            foreign = any(name.split(".")[0] == "fairseq_cli" for name in sys.modules)
            print(f"{prog}: {interrupted_line(foreign)}", file=sys.stderr, flush=True)
            end_by_interrupt()  # killed by SIGINT: status 130 in the shell
            return
        if isinstance(error, BrokenPipeError):  # the reader of standard output went away
            silence_stdout()
            return
        if isinstance(error, UnicodeEncodeError):
            line = encoding_problem(error)
            silence_stdout()
        else:
            line = str(error) if isinstance(error, UserError) else one_line_cause(error)
        if line is not None:
            print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
        else:
            previous(kind, error, traceback)

    hook.one_line_user_errors = True  # type: ignore[attr-defined]
    return hook
