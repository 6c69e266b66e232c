"""Atomic checkpoint copies, so that a killed training run always resumes.

fairseq writes ``checkpoint_<epoch>_<update>.pt`` atomically (a ``.tmp`` file, then a rename),
but then makes ``checkpoint_best.pt`` and ``checkpoint_last.pt`` with ``PathManager.copy``, which
without iopath is ``shutil.copyfile`` straight onto the destination. A process killed during that
copy leaves a truncated ``checkpoint_last.pt``, and the next run fails to resume from it.

Row ``atomic_checkpoint_copy`` wraps ``checkpoint_utils.save_checkpoint``
(:func:`saving_with_atomic_copies`): while it saves a checkpoint of one of our runs,
``checkpoint_utils`` sees :func:`atomic_copy_path_manager`'s ``PathManager``, whose ``copy``
goes through :func:`~user_plugin.files.atomic.atomic_copy` (a temporary file in the
destination's directory, then ``os.replace``). The copies hold the same bytes as fairseq's.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..files.atomic import atomic_copy
from .temporary import replaced


def atomic_copy_path_manager(path_manager: type) -> type:
    """fairseq's ``PathManager`` (``path_manager``) with an atomic ``copy`` for local paths.
    Remote paths (an iopath handler) keep fairseq's copy."""
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


def saving_with_atomic_copies(save_checkpoint: Any) -> Any:
    """``checkpoint_utils.save_checkpoint`` during which the module's ``PathManager`` (which it
    copies ``checkpoint_last.pt`` and ``checkpoint_best.pt`` with) is
    :func:`atomic_copy_path_manager`'s."""
    from fairseq import checkpoint_utils as module

    atomic = atomic_copy_path_manager(module.PathManager)

    @functools.wraps(save_checkpoint)
    def save(*args: Any, **kwargs: Any) -> Any:
        with replaced(module, "PathManager", atomic):
            return save_checkpoint(*args, **kwargs)

    return save
