"""Atomic writes: a reader sees the old file or the complete new one, never a part.

Every write goes to a temporary file in the destination's directory (so that the final
``os.replace`` is a rename within one file system) and is moved into place only when complete;
on any error the temporary file is removed and the destination is left as it was. Temporary
files get the usual mode (``0666`` less the umask), not ``mkstemp``'s ``0600``.

All temporary files (and directories) of these writes are named by :func:`temp_name_parts`:
``.<destination name>.<random>`` + :data:`TEMP_SUFFIX`, beside the destination, so that one
left behind by a killed process is recognised by :func:`temp_destination`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import file_error

#: The ending of every temporary file or directory of an atomic write.
TEMP_SUFFIX = ".vaswani-tmp"
_TEMP_NAME = re.compile(r"\.(?P<destination>.+)\.[^.]+" + re.escape(TEMP_SUFFIX))


def temp_name_parts(destination: str | os.PathLike) -> dict[str, str]:
    """``prefix`` and ``suffix`` for ``tempfile.mkstemp``/``mkdtemp`` of a temporary file that
    will become ``destination`` (whose name it carries)."""
    return {"prefix": f".{Path(destination).name}.", "suffix": TEMP_SUFFIX}


def temp_destination(path: str | os.PathLike) -> Path | None:
    """The destination that ``path`` was the temporary file of, or None when its name is not
    one of :func:`temp_name_parts`'s."""
    path = Path(path)
    match = _TEMP_NAME.fullmatch(path.name)
    return None if match is None else path.with_name(match.group("destination"))


def make_temp_dir(destination: str | os.PathLike) -> Path:
    """A new temporary directory beside ``destination``, for writes that produce several files
    (moved out of it one by one); the caller removes it."""
    destination = Path(destination)
    parent = destination.parent if str(destination.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=parent, **temp_name_parts(destination)))
    except OSError as error:
        raise file_error(destination, error, writing=True) from None


def _usual_mode() -> int:
    """``0666`` less the process umask: the mode ``open(path, "w")`` would give a new file."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Let ``write(temp_path)`` fill a temporary file next to ``path``, then move it into place.

    The destination's directory is created if missing. An ``OSError`` (here or in ``write``)
    becomes a one-line :class:`UserError` naming ``path``; any other exception propagates. In
    both cases the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=directory, **temp_name_parts(path))
        os.close(handle)
    except OSError as error:
        raise file_error(path, error, writing=True) from None
    try:
        write(temp)
        os.chmod(temp, _usual_mode())
        os.replace(temp, path)
    except BaseException as error:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        if isinstance(error, OSError):
            raise file_error(path, error, writing=True) from None
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)

    atomic_write(path, write)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy the file ``src`` to ``dst`` atomically (``shutil.copyfile`` into a temporary file
    beside ``dst``, then ``os.replace``). An unreadable ``src`` is a :class:`UserError` naming
    ``src``; a failed write one naming ``dst``."""

    def write(temp: str) -> None:
        try:
            shutil.copyfile(src, temp)
        except OSError as error:
            if error.filename is not None and os.fspath(error.filename) == os.fspath(src):
                raise file_error(src, error) from None
            raise

    atomic_write(dst, write)

