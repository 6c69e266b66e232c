"""Small helpers shared by the command-line scripts: one-line errors and atomic writes.

A user of a script who gives bad input gets one line on stderr that names the file and what is
wrong, and a non-zero exit status, never a traceback. Outputs are written to a temporary file in
the destination's directory and moved into place with ``os.replace``, so a reader sees either the
old file or the complete new one, and an error leaves nothing behind.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type name when it has none)."""
    for line in str(error).splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None,
             prog: str) -> int:
    """Call ``main(argv)``; turn a :class:`UserError` into ``prog: error: ...`` and status 1."""
    try:
        return main(argv)
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Let ``write(temp_path)`` fill a temporary file next to ``path``, then move it into place.

    The temporary file lives in the destination directory (created if missing) so that
    ``os.replace`` is an atomic rename; on any error it is removed and ``path`` is left untouched.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        os.close(handle)
    except OSError as error:
        raise UserError(f"{path}: cannot write here ({first_line(error)})") from None
    try:
        write(temp)
        os.chmod(temp, 0o666 & ~_current_umask())  # mkstemp creates 0600; use the usual mode
        os.replace(temp, path)
    except BaseException as error:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        if isinstance(error, OSError):
            raise UserError(f"{path}: cannot write ({first_line(error)})") from None
        raise


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)

    atomic_write(path, write)


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file without their line ends, or a :class:`UserError`."""
    try:
        with open(path, encoding="utf-8", newline=None) as handle:
            return [line.rstrip("\n") for line in handle]
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a text file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not valid UTF-8 text") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read ({first_line(error)})") from None
