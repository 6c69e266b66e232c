"""Errors the user can fix, reported as one line: what the plugin and the scripts raise for bad
input or unusable files, and how a command line turns them into ``prog: error: ...``.

A user who gives a missing, unreadable or malformed file gets one line on stderr that names the
file and what is wrong, and a non-zero exit status, never a traceback. :func:`file_error` is
the one place where operating-system and decoding errors about a path become such a line.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence

from .standard_streams import BROKEN_PIPE_STATUS, encoding_problem, silence_stdout


class UserError(Exception):
    """A problem with the user's input or files, reported as one line without a traceback."""


class InvalidValue(UserError, ValueError):
    """A value the user gave that the plugin refuses (an option out of its range, a sentence
    longer than the model): one line wherever it reaches the user, fairseq's CLIs included
    (they report a :class:`UserError` through the plugin's exception hook), and a
    ``ValueError`` for code that checks values."""


def first_line(error: BaseException, with_type: bool = False) -> str:
    """The first non-empty line of an exception's message, or its type name when it has none.

    With ``with_type`` the type name is put in front (``KeyError: 'cfg'``), for errors whose
    message alone does not say what went wrong.
    """
    name = type(error).__name__
    for line in str(error).splitlines():
        if line.strip():
            return f"{name}: {line.strip()}" if with_type else line.strip()
    return name


#: Status of a command stopped by an interrupt (Ctrl-C): 128 + SIGINT, as the shell reports it.
INTERRUPTED = 130

#: What this process's writes completed, in order (:func:`note_written`), and the callables that
#: say what an interrupted run left (:func:`on_interrupt`), for :func:`interrupted_line`.
_written: list[str] = []
_interrupt_notes: list[Callable[[], str | None]] = []


def note_written(path: str | os.PathLike) -> None:
    """Record that ``path`` was written whole (an atomic write moved it into place)."""
    _written.append(os.fspath(path))


def on_interrupt(note: Callable[[], str | None]) -> None:
    """Let ``note()`` say what an interrupt leaves (a training run: its last checkpoint);
    the last registered note that says something is used. Registering one twice is a no-op."""
    if note not in _interrupt_notes:
        _interrupt_notes.append(note)


def interrupted_line(foreign: bool = False) -> str:
    """The line an interrupt (Ctrl-C) prints after ``prog: ``: what was left. Every write of
    the project is atomic, so a file is either complete or untouched; the line says which
    files this process completed, or the note of the work it ran (:func:`on_interrupt`).
    ``foreign``: the program (one of fairseq's) also writes files of its own, which the line
    cannot vouch for."""
    for note in reversed(_interrupt_notes):
        text = note()
        if text:
            return f"interrupted: {text}"
    if foreign and not _written:
        return ("interrupted before its end: what it printed, and any file it writes itself "
                "(such as --results-path), is incomplete")
    if not _written:
        return "interrupted: no file was written or changed"
    count = len(dict.fromkeys(_written))
    return (f"interrupted: {count} file(s) were written whole before it (the last: "
            f"{_written[-1]}); the one being written, if any, was not changed: rerun to finish")


def end_by_interrupt() -> None:
    """End this process as an interrupt does: killed by SIGINT (status 130 in the shell, so
    that a calling script stops too), once the interpreter's exit functions have run (logs
    flushed, a save directory's lock released) and the standard streams are flushed, but
    without the interpreter's teardown of extension modules, where torch can abort the process
    (``terminate called without an active exception``, status 134) when the interrupt stopped
    a training step."""
    import atexit
    import signal

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None,
             prog: str) -> int:
    """Call ``main(argv)``; turn a :class:`UserError` into ``prog: error: ...`` and status 1,
    an interrupt (Ctrl-C) into ``prog: interrupted: WHAT WAS LEFT`` and status 130, and the
    standard streams' problems (:mod:`.standard_streams`) into their line or quiet end."""
    try:
        return main(argv)
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of standard output went away: a quiet end
        silence_stdout()
        return BROKEN_PIPE_STATUS
    except UnicodeEncodeError as error:
        line = encoding_problem(error)
        if line is None:
            raise
        silence_stdout()
        print(f"{prog}: error: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted_line()}", file=sys.stderr, flush=True)
        return INTERRUPTED


def console_script(main: Callable[[Sequence[str] | None], int], prog: str) -> Callable[[], int]:
    """The entry point of an installed command: ``main`` on the command line's arguments
    through :func:`run_main` (bad input as one ``prog: error:`` line and status 1, an
    interrupt as one ``prog: interrupted:`` line and status 130)."""

    def cli_main() -> int:
        status = run_main(main, None, prog)
        if status == INTERRUPTED:
            end_by_interrupt()
        return status

    cli_main.__doc__ = f"The ``{prog}`` command: bad input as one error line and status 1."
    return cli_main


def _os_reason(error: OSError) -> str:
    """What an ``OSError`` says, without the file name it repeats: ``permission denied``,
    ``no space left on device``..."""
    if error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]
    return first_line(error)


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(error: BaseException) -> OSError | None:
    """The operating-system error behind ``error``: itself, the ``OSError`` it was raised from,
    or the one a library written in Rust spelled into its message (safetensors reports a full
    disk as ``SafetensorError: ... No space left on device (os error 28)``); None when there
    is none (a :class:`UserError` already says what is wrong)."""
    seen = set()
    while error is not None and id(error) not in seen and not isinstance(error, UserError):
        if isinstance(error, OSError):
            return error
        match = _RUST_OS_ERROR.search(str(error))
        if match:
            number = int(match.group(1))
            return OSError(number, os.strerror(number))
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def file_error(path: str | os.PathLike, error: OSError | UnicodeDecodeError, writing: bool = False,
               expected: str = "a file") -> UserError:
    """The one-line :class:`UserError` for ``error``, raised while reading (or ``writing``)
    ``path``: ``PATH: no such file``, ``PATH: is a directory, expected <expected>``,
    ``PATH: not valid UTF-8 text``, or ``PATH: cannot read (permission denied)`` and the like
    (``cannot write (no space left on device)`` ...).

    Raise it with ``from None``: the line says all the user needs.
    """
    if isinstance(error, UnicodeDecodeError):
        return UserError(f"{path}: not valid UTF-8 text")
    if isinstance(error, FileNotFoundError) and not writing:
        return UserError(f"{path}: no such file")
    if isinstance(error, IsADirectoryError):
        return UserError(f"{path}: is a directory, expected {expected}")
    action = "write" if writing else "read"
    return UserError(f"{path}: cannot {action} ({_os_reason(error)})")


def finite_float(text: str) -> float:
    """An argparse ``type`` for finite numbers: ``nan`` and ``inf`` are argparse's usage
    error naming the option, not a value that silently changes every result."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for integers of at least ``minimum``: anything else is argparse's
    one usage error naming the option."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def int_between(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse ``type`` for integers from ``minimum`` to ``maximum``: anything else is
    argparse's one usage error naming the option (a port above 65535, say, which a socket
    would otherwise take modulo 65536)."""

    def parse(text: str) -> int:
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be from {minimum} to {maximum}, got {value}")
        return value

    parse.__name__ = f"integer from {minimum} to {maximum}"
    return parse
