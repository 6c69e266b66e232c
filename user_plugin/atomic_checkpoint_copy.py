"""Atomic checkpoint copies, so that a killed training run always resumes.

fairseq writes ``checkpoint_<epoch>_<update>.pt`` atomically (a ``.tmp`` file, then a rename),
but then makes ``checkpoint_best.pt`` and ``checkpoint_last.pt`` with ``PathManager.copy``, which
without iopath is ``shutil.copyfile`` straight onto the destination. A process killed during that
copy leaves a truncated ``checkpoint_last.pt``, and the next run fails to resume from it.

:func:`install_atomic_checkpoint_copy`, called by the plugin's ``__init__``, makes those copies
atomic (a temporary file in the destination's directory, then ``os.replace``).
"""

from __future__ import annotations

import os
import shutil
import tempfile


def _atomic_local_copy(src_path: str, dst_path: str) -> None:
    """Copy ``src_path`` to a temporary file next to ``dst_path``, then ``os.replace`` it there:
    a reader (or a resumed run) sees the old ``dst_path`` or the complete copy, never a part."""
    directory = os.path.dirname(os.path.abspath(dst_path))
    handle, temp = tempfile.mkstemp(
        prefix=f".{os.path.basename(dst_path)}.", suffix=".tmp", dir=directory
    )
    os.close(handle)
    try:
        shutil.copyfile(src_path, temp)
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(temp, 0o666 & ~mask)  # mkstemp creates 0600; give the copy the usual mode
        os.replace(temp, dst_path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def install_atomic_checkpoint_copy() -> None:
    """Make the copies that fairseq's ``checkpoint_utils.save_checkpoint`` makes of a new
    checkpoint (``checkpoint_best.pt``, ``checkpoint_last.pt``...) atomic for local paths.

    ``checkpoint_utils`` looks up ``PathManager`` as a module global; it is replaced there (and
    only there) by a subclass whose ``copy`` writes a temporary file in the destination's
    directory and renames it. Remote paths (an iopath handler) keep fairseq's copy. Idempotent.
    """
    from fairseq import checkpoint_utils
    from fairseq.file_io import PathManager

    current = checkpoint_utils.PathManager
    if getattr(current, "atomic_local_copy", False):
        return

    class AtomicCopyPathManager(current):  # type: ignore[valid-type,misc]
        """fairseq's ``PathManager`` with an atomic ``copy`` for local files."""

        atomic_local_copy = True

        @staticmethod
        def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
            if PathManager.path_requires_pathmanager(dst_path):
                return current.copy(src_path, dst_path, overwrite=overwrite)
            if not overwrite and os.path.exists(dst_path):
                return False
            _atomic_local_copy(src_path, dst_path)
            return True

    checkpoint_utils.PathManager = AtomicCopyPathManager
