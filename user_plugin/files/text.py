"""Reading UTF-8 text files line by line, with one-line errors naming the file.

Where a line ends is decided here for every reader of the project: ``newline`` is ``open``'s
argument, ``"\\n"`` (only LF ends a line; a stray CR stays inside it) for corpora streamed by the
data preparation, ``None`` (universal newlines: LF, CRLF and a lone CR) for :func:`read_lines`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from .errors import file_error


def iter_lines(path: str | os.PathLike, newline: str | None = "\n") -> Iterator[str]:
    """The lines of a UTF-8 text file without their line ends, read lazily.

    A missing file, a directory, an unreadable file or bytes that are not UTF-8 raise a
    one-line :class:`~user_plugin.files.errors.UserError` naming ``path``.
    """
    try:
        handle = open(path, encoding="utf-8", newline=newline)
    except OSError as error:
        raise file_error(path, error, expected="a text file") from None
    with handle:
        try:
            for line in handle:
                yield line[:-1] if line.endswith("\n") else line
        except (OSError, UnicodeDecodeError) as error:
            raise file_error(path, error, expected="a text file") from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 text file without their line ends (universal newlines), or a
    one-line :class:`~user_plugin.files.errors.UserError` naming ``path``."""
    return list(iter_lines(path, newline=None))
