"""Reading UTF-8 text line by line, with one-line errors naming the file.

The project's line rule: **a line ends at LF (``\\n``) and nowhere else**. A stray CR, a form
feed, NEL (U+0085), the Unicode line and paragraph separators (U+2028, U+2029) or the other
characters that ``str.splitlines`` and universal newlines treat as line ends stay inside their
line. It is the rule of ``wc -l`` and of the recipes' line-count checks, so every tool that
reads line-aligned text (corpora, hypotheses, references, the hub's input) sees as many lines
as the checks counted, and line N of one file stays aligned with line N of another.
:func:`iter_lines`, :func:`split_lines` and :func:`decode_lines` apply it. A byte-order mark at
the start of a file (or of standard input), which some editors write, is not text: every reader
drops it, so that it never sticks to the first word of a reference, a source or a corpus.

:func:`read_lines` reads with universal newlines (LF, CRLF and a lone CR end a line): for logs
and progress output, whose carriage returns redraw a line, never for line-aligned text.

:func:`single_line` is the whitespace rule that text gets before tokenisation, in the data
preparation and in the hub alike: every run of whitespace (including the characters above and
tabs) becomes one space, and byte-order marks go.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from .errors import UserError, file_error

#: The only line end of line-aligned text.
LINE_END = "\n"
#: U+FEFF: a byte-order mark at the start of a file, a zero-width no-break space elsewhere.
BYTE_ORDER_MARK = "\ufeff"


def iter_lines(path: str | os.PathLike, newline: str | None = LINE_END) -> Iterator[str]:
    """The lines of a UTF-8 text file without their line ends, read lazily; by default (the
    project's rule) only LF ends a line (``newline`` is ``open``'s argument).

    A byte-order mark at the start of the file is dropped. A missing file, a directory, an
    unreadable file or bytes that are not UTF-8 raise a one-line
    :class:`~user_plugin.files.errors.UserError` naming ``path``.
    """
    try:
        handle = open(path, encoding="utf-8-sig", newline=newline)
    except OSError as error:
        raise file_error(path, error, expected="a text file") from None
    with handle:
        try:
            for line in handle:
                yield line[:-1] if line.endswith("\n") else line
        except (OSError, UnicodeDecodeError) as error:
            raise file_error(path, error, expected="a text file") from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 log or progress output without their line ends, with universal
    newlines (a lone CR ends a line too), or a one-line
    :class:`~user_plugin.files.errors.UserError` naming ``path``. Line-aligned text is read
    with :func:`iter_lines`."""
    return list(iter_lines(path, newline=None))


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` by the project's rule (only LF ends a line); a final LF ends the
    last line rather than starting an empty one."""
    if not text:
        return []
    lines = text.split(LINE_END)
    if lines[-1] == "":
        lines.pop()
    return lines


def decode_lines(data: bytes, name: str) -> list[str]:
    """The lines (:func:`split_lines`) of UTF-8 bytes read from ``name`` (a file or
    ``standard input``), without a byte-order mark at the start; bytes that are not UTF-8 are
    a one-line
    :class:`~user_plugin.files.errors.UserError` giving the line and byte offset."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise UserError(f"{name}: not valid UTF-8 text (line {line}, byte {error.start})") \
            from None
    return split_lines(text.removeprefix(BYTE_ORDER_MARK))


def single_line(text: str) -> str:
    """``text`` with byte-order marks removed and every run of whitespace (any Unicode space,
    tab, CR, form feed, NEL, U+2028...) made one space, trimmed."""
    return " ".join(text.replace(BYTE_ORDER_MARK, "").split())
