"""Atomic checkpoint copies, so that a killed training run always resumes.

fairseq writes ``checkpoint_<epoch>_<update>.pt`` atomically (a ``.tmp`` file, then a rename),
but then makes ``checkpoint_best.pt`` and ``checkpoint_last.pt`` with ``PathManager.copy``, which
without iopath is ``shutil.copyfile`` straight onto the destination. A process killed during that
copy leaves a truncated ``checkpoint_last.pt``, and the next run fails to resume from it.

:func:`install_atomic_checkpoint_copy`, called by the plugin's ``__init__``, makes those copies
atomic with :func:`~user_plugin.files.atomic.atomic_copy` (a temporary file in the destination's
directory, then ``os.replace``).
"""

from __future__ import annotations

import os

from .files.atomic import atomic_copy


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
            atomic_copy(src_path, dst_path)
            return True

    checkpoint_utils.PathManager = AtomicCopyPathManager
