"""Atomic checkpoint copies, so that a killed training run always resumes.

fairseq writes ``checkpoint_<epoch>_<update>.pt`` atomically (a ``.tmp`` file, then a rename),
but then makes ``checkpoint_best.pt`` and ``checkpoint_last.pt`` with ``PathManager.copy``, which
without iopath is ``shutil.copyfile`` straight onto the destination. A process killed during that
copy leaves a truncated ``checkpoint_last.pt``, and the next run fails to resume from it.

:func:`atomic_copy_path_manager`, installed by :mod:`user_plugin.fairseq_patches`, makes those
copies atomic with :func:`~user_plugin.files.atomic.atomic_copy` (a temporary file in the
destination's directory, then ``os.replace``).
"""

from __future__ import annotations

import os

from ..files.atomic import atomic_copy


def atomic_copy_path_manager(path_manager: type) -> type:
    """fairseq's ``PathManager`` (``path_manager``) with an atomic ``copy`` for local paths.

    ``checkpoint_utils`` looks up ``PathManager`` as a module global, so
    :mod:`user_plugin.fairseq_patches` (row ``atomic_checkpoint_copy``) puts this subclass there
    (and only there): its ``copy`` writes a temporary file in the destination's directory and
    renames it. Remote paths (an iopath handler) keep fairseq's copy.
    """
    from fairseq.file_io import PathManager

    class AtomicCopyPathManager(path_manager):  # type: ignore[valid-type,misc]
        """fairseq's ``PathManager`` with an atomic ``copy`` for local files."""

        @staticmethod
        def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
            if PathManager.path_requires_pathmanager(dst_path):
                return path_manager.copy(src_path, dst_path, overwrite=overwrite)
            if not overwrite and os.path.exists(dst_path):
                return False
            atomic_copy(src_path, dst_path, training_save=True)  # the run's own checkpoint
            return True

    return AtomicCopyPathManager
