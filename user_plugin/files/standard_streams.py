"""A command's standard streams, where the user's shell, not the command, decides what they
are: an input that is closed (``<&-``), an output whose reader went away (a pipe into
``head``), an output whose encoding cannot hold the text (``PYTHONIOENCODING=ascii`` and
German). Each gets one line naming it, or for the closed pipe the quiet exit of a
conventional tool; :func:`~user_plugin.files.errors.run_main` (the project's commands) and the
plugin's exception hook (fairseq's commands running our task or model) apply them.
"""

from __future__ import annotations

import codecs
import os
import sys

#: The exit status of a command whose standard output's reader went away: that of a tool
#: ended by SIGPIPE (128 + 13), as ``yes | head`` leaves it.
BROKEN_PIPE_STATUS = 141

CLOSED_INPUT = ("standard input is closed: give the sentences on standard input, one per line "
                "(from a file or a pipe)")


def input_is_closed() -> bool:
    """Standard input was closed when the command started (the interpreter has none)."""
    return sys.stdin is None


def silence_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush of what could
    not be written (a reader gone, an encoding refused) raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def encoding_problem(error: BaseException) -> str | None:
    """The line for a ``UnicodeEncodeError`` of standard output's encoding (the text holds a
    letter it has no code for), naming the encoding and the letter; None for another
    error."""
    encoding = getattr(sys.stdout, "encoding", None)
    if not isinstance(error, UnicodeEncodeError) or not encoding:
        return None
    try:
        if codecs.lookup(encoding).name != codecs.lookup(error.encoding).name:
            return None
    except LookupError:
        return None
    letter = error.object[error.start:error.end]
    return (f"standard output's encoding, {encoding}, cannot write {letter!r}: set "
            "PYTHONIOENCODING=utf-8 (or a UTF-8 locale)")
