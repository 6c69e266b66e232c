"""Atomic writes: a reader sees the old file or the complete new one, never a part.

Every write goes to a temporary file in the destination's directory (so that the final
``os.replace`` is a rename within one file system) and is moved into place only when complete;
on any error the temporary file is removed and the destination is left as it was. Temporary
files get the usual mode (``0666`` less the umask), not ``mkstemp``'s ``0600``.

All temporary files (and directories) of these writes are named by :func:`temp_name_parts`:
``.<destination name>.<random>`` + :data:`TEMP_SUFFIX`, beside the destination, so that one
left behind by a killed process is recognised by :func:`temp_destination`. While a temporary
file is written its writer holds an advisory lock on it (``flock``), which the kernel drops
when the writer ends, however it ends: a temporary file that nobody holds is an orphan of a
killed write. :func:`remove_stale_temporaries` removes those of a directory, and every atomic
write does it in its destination's directory before it starts, so a killed write's partial
file (as large as a checkpoint) does not keep a disk full.

What may be written where: :func:`refuse_input_clash` refuses, before anything is written, an
output that is, holds or lies inside one of the inputs it is made from, or that is a training
checkpoint (:mod:`.training_state`); every atomic write applies it, and commands call it with
all they read before their work starts. A completed write is recorded
(:func:`~user_plugin.files.errors.note_written`) for the line an interrupt prints.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import UserError, file_error, note_written
from .training_state import training_checkpoint_problem

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


def remove_stale_temporaries(directory: str | os.PathLike) -> list[tuple[Path, int]]:
    """Remove the temporary files of atomic writes in ``directory`` whose writer has ended
    (nobody holds their lock); return each removed path with its size. Temporary files being
    written, directories and every other file are left alone; a directory that cannot be
    listed is skipped (the write that follows reports the problem)."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if temp_destination(entry.name) is None or not entry.is_file(follow_symlinks=False):
            continue
        try:
            handle = os.open(entry.path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            size = os.fstat(handle).st_size
            os.unlink(entry.path)
            removed.append((Path(entry.path), size))
        except OSError:  # held by a live writer (BlockingIOError), or already gone
            pass
        finally:
            os.close(handle)
    return removed


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same path once symbolic links, ``..`` and the
    current directory are resolved, or (both existing) the same inode, a hard link included."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _within(directory: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` lies inside the existing directory ``directory`` at any depth (not
    ``directory`` itself): one of the ancestors of ``path``, symbolic links resolved, is
    ``directory`` (by :func:`same_file`, so a directory reached by another path or through a
    bind mount counts too)."""
    if not os.path.isdir(directory):
        return False
    return any(same_file(directory, ancestor)
               for ancestor in Path(os.path.realpath(path)).parents)


#: The kinds of file an output never is, by the test of their mode.
SPECIAL_FILES = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                 (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket"))


def special_file_problem(output: str | os.PathLike) -> str | None:
    """Why ``output`` cannot be written: it exists (links followed) and is a device, a named
    pipe or a socket. Such a target is refused rather than written through: an output is
    written whole beside its path and moved into place, which would replace the node itself
    (as root, ``/dev/full`` became a regular file); writing through instead would block on a
    pipe nobody reads, destroy a disk given as a block device, and give the command's checks
    of what it wrote (a reloaded checkpoint) nothing to read."""
    try:
        mode = os.stat(output).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in SPECIAL_FILES:
        if test(mode):
            return (f"{output}: a {kind}, not a regular file; an output is written as a new "
                    "file and moved into place, which would replace it: give the path of a "
                    "regular file (nothing was written)")
    return None


def parent_problem(output: str | os.PathLike) -> str | None:
    """Why no file can be made at ``output``: the nearest of its parents that exists is not a
    directory (an output path under a regular file), or None."""
    parent = Path(os.path.abspath(output)).parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if os.path.isdir(parent):
        return None
    return (f"{output}: cannot be written: {parent} is not a directory (nothing was "
            "written)")


def refuse_input_clash(output: str | os.PathLike, inputs: Sequence[str | os.PathLike] = (),
                       training_save: bool = False) -> None:
    """Raise a one-line :class:`UserError` when writing ``output`` (a file, or a directory
    written whole) could lose or change what a command reads or what a training run keeps:

    * ``output`` names no file (empty, ``.``, ``..``);
    * it is one of ``inputs`` (:func:`same_file`: the same path once resolved, or the same
      inode, a hard link included);
    * it is a directory holding one of ``inputs`` at any depth (replacing the directory would
      delete the input);
    * it lies inside an input that is a directory (the output would change that input, which
      is read, or identified by its content, as a whole);
    * it is a training checkpoint, or a checkpoint name of a training run's save directory
      (:func:`~user_plugin.files.training_state.training_checkpoint_problem`), unless
      ``training_save`` (a training run writing its own checkpoints);
    * it is a device, a named pipe or a socket (:func:`special_file_problem`);
    * it lies under a path that is not a directory (:func:`parent_problem`).

    Called by every atomic write given its inputs, before anything is written, and by commands
    before their work starts (also for outputs that are directories)."""
    if not os.fspath(output).strip() or Path(output).name in ("", ".", ".."):
        raise UserError(f"{os.fspath(output)!r}: not a file name to write to")
    problem = special_file_problem(output) or parent_problem(output)
    if problem is not None:
        raise UserError(problem)
    for source in inputs:
        if same_file(output, source):
            also = "" if os.fspath(output) == os.fspath(source) else f" (as {source})"
            raise UserError(f"{output}: is also an input{also}; an output never replaces an "
                            "input: choose another output path (nothing was written)")
    for source in inputs:
        if os.path.isdir(output) and _within(output, source):
            raise UserError(f"{output}: holds the input {source}; an output never contains an "
                            "input (writing it would delete the input): choose another output "
                            "path (nothing was written)")
        if os.path.isdir(source) and _within(source, output):
            raise UserError(f"{output}: lies inside the input directory {source}; an output "
                            "never changes an input: choose an output path outside it (nothing "
                            "was written)")
    if not training_save:
        problem = training_checkpoint_problem(output)
        if problem is not None:
            raise UserError(f"{output}: {problem}; an output never replaces the state of a "
                            "training run: choose another output path (nothing was written)")


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


def atomic_write(path: str | os.PathLike, write: Callable[[str], None],
                 inputs: Sequence[str | os.PathLike] = (), training_save: bool = False) -> None:
    """Let ``write(temp_path)`` fill a temporary file next to ``path``, then move it into place.

    The destination's directory is created if missing, and orphaned temporary files of
    earlier writes in it are removed first (:func:`remove_stale_temporaries`). The temporary
    file is locked while it is written. An ``OSError`` (here or in ``write``: a full disk, a
    read-only file system...) becomes a one-line :class:`UserError` naming ``path``; any other
    exception propagates. In both cases the temporary file is removed and ``path`` is
    untouched. A ``path`` that is, holds or lies inside one of ``inputs`` (the files the
    content was made from), or that is a training checkpoint (unless ``training_save``: a
    training run saving its own state), is refused before anything is written
    (:func:`refuse_input_clash`).
    """
    refuse_input_clash(path, inputs, training_save)
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(directory)
        handle, temp = tempfile.mkstemp(dir=directory, **temp_name_parts(path))
    except OSError as error:
        raise file_error(path, error, writing=True) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        write(temp)
        os.chmod(temp, _usual_mode())
        os.replace(temp, path)
        if not any(temp_destination(parent) for parent in path.parents):
            note_written(path)  # not a file of a directory being staged
    except BaseException as error:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        if isinstance(error, OSError):
            raise file_error(path, error, writing=True) from None
        raise
    finally:
        os.close(handle)


def atomic_write_text(path: str | os.PathLike, text: str,
                      inputs: Sequence[str | os.PathLike] = ()) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, never onto one of ``inputs``."""

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)

    atomic_write(path, write, inputs)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike,
                training_save: bool = False) -> None:
    """Copy the file ``src`` to ``dst`` atomically (``shutil.copyfile`` into a temporary file
    beside ``dst``, then ``os.replace``). An unreadable ``src`` is a :class:`UserError` naming
    ``src``; a failed write one naming ``dst``. ``training_save``: a training run copying its
    own checkpoint (``checkpoint_last.pt``), which :func:`refuse_input_clash` allows."""

    def write(temp: str) -> None:
        try:
            shutil.copyfile(src, temp)
        except OSError as error:
            if error.filename is not None and os.fspath(error.filename) == os.fspath(src):
                raise file_error(src, error) from None
            raise

    atomic_write(dst, write, [src], training_save)

