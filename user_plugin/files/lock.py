"""One process at a time in a directory: an advisory lock on a file inside it.

The lock is the kernel's (``flock`` on the lock file), held for as long as the process keeps
the file open; the kernel drops it when the process ends, however it ends (SIGKILL, a crash,
a lost node's processes). Processes forked by the holder (data loader workers) close their
copy of the descriptor at once, so the lock never outlives the process that took it. A lock
file that is present but not locked is therefore the leftover of an ended holder, and the next
process takes it over without asking anyone.

The holder writes one line into the file (process id, host, start time, command), so that a
refused process can say who holds the directory. A holder that ends normally removes the file
(the directory is left as it was); one that is killed leaves it, and its successor reports
the takeover.

``flock`` works between processes of one machine and, on Linux, over NFS (where it is mapped
to the server's byte-range locks); it is not reliable on every network file system.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from .errors import UserError, file_error


class DirectoryInUse(UserError):
    """Another live process holds the lock of the directory."""


class DirectoryLock:
    """The lock file ``name`` in ``directory``, held by this process (see the module
    docstring). Use :meth:`acquire`; :meth:`release` (also run at exit) gives it up.

    ``previous_holder`` is the line a holder that ended without releasing the lock left in
    the file (empty when the lock was free and clean).
    """

    def __init__(self, path: Path, handle: int, previous_holder: str) -> None:
        self.path = path
        self._handle: int | None = handle
        self.previous_holder = previous_holder

    @classmethod
    def acquire(cls, directory: str | os.PathLike, name: str, purpose: str) -> DirectoryLock:
        """Take the lock ``directory/name`` (the directory is created if missing), or raise
        :class:`DirectoryInUse` naming the live holder: ``DIR is in use by another PURPOSE
        (pid ...)``. Any other failure is a one-line :class:`UserError` naming the file."""
        path = Path(directory) / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise file_error(path.parent, error, writing=True) from None
        while True:
            try:
                handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                raise file_error(path, error, writing=True) from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_line(handle) or "holder not recorded yet"
                os.close(handle)
                raise DirectoryInUse(
                    f"{Path(directory)} is in use by another {purpose} ({holder}); wait for it "
                    "to end, or use another directory") from None
            except OSError as error:
                os.close(handle)
                raise file_error(path, error, writing=True) from None
            if _same_file(handle, path):
                break
            # the previous holder removed the file between our open and our lock: retry on
            # the file that is there now
            os.close(handle)
        previous = _read_line(handle)
        try:
            os.ftruncate(handle, 0)
            os.pwrite(handle, (_holder_line() + "\n").encode("utf-8"), 0)
        except OSError as error:
            os.close(handle)
            raise file_error(path, error, writing=True) from None
        lock = cls(path, handle, previous)
        atexit.register(lock.release)
        _release_in_multiprocessing_children(lock)
        os.register_at_fork(after_in_child=lock._forget)
        return lock

    @property
    def held(self) -> bool:
        return self._handle is not None

    def _forget(self) -> None:
        """In a forked child (a data loader's worker...): drop the inherited descriptor, so
        that the lock ends with the process that took it and the child never removes it."""
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                os.close(handle)
            except OSError:
                pass

    def release(self) -> None:
        """Remove the lock file and give up the lock (idempotent)."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            if _same_file(handle, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(handle)


def _same_file(handle: int, path: Path) -> bool:
    """The open file ``handle`` is the file at ``path`` now (not one removed since)."""
    try:
        mine, there = os.fstat(handle), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _read_line(handle: int) -> str:
    try:
        data = os.pread(handle, 4096, 0)
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip().split("\n")[0]


def _holder_line() -> str:
    command = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {os.getpid()} on {socket.gethostname()}, started {started}, {command}"


def _release_in_multiprocessing_children(lock: DirectoryLock) -> None:
    """A process started by ``multiprocessing`` (fairseq's one process per GPU) ends with
    ``os._exit`` after running its finalizers, not ``atexit``: register the release there."""
    from multiprocessing import util

    util.Finalize(lock, lock.release, exitpriority=0)
