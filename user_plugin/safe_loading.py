"""Let fairseq's checkpoint loaders work under torch's ``weights_only`` safe loading.

Since torch 2.6, ``torch.load`` refuses to unpickle anything but tensors and plain containers
unless the type is allow-listed. fairseq's loaders do not pass ``weights_only``, so a checkpoint
holding, say, a numpy scalar from ``--eval-bleu`` meters fails to load in ``fairseq-generate``.

Rather than switching safe loading off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), this module
allow-lists exactly the types fairseq's own checkpoints contain. The plugin's ``__init__`` calls
:func:`allow_fairseq_checkpoint_globals`, which runs before any checkpoint is read in every
fairseq entry point that takes ``--user-dir`` and in every spawned training process.

It also makes fairseq's checkpoint *copies* atomic (:func:`install_atomic_checkpoint_copy`):
fairseq writes ``checkpoint_<epoch>_<update>.pt`` atomically (a ``.tmp`` file, then a rename),
but then makes ``checkpoint_best.pt`` and ``checkpoint_last.pt`` with ``PathManager.copy``, which
without iopath is ``shutil.copyfile`` straight onto the destination. A process killed during that
copy leaves a truncated ``checkpoint_last.pt``, and the next run fails to resume from it.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import typing
from typing import List

import torch


def fairseq_checkpoint_globals() -> List[object]:
    """The non-tensor types found in fairseq checkpoints and in its distributed state broadcast.

    * ``argparse.Namespace``: the ``args`` of checkpoints written by argparse-era fairseq;
    * numpy scalars and arrays: meters saved by ``--eval-bleu`` validation;
    * omegaconf containers, ``typing.Any`` and builtins, fairseq's ``_TensorPlaceholder``: the
      state that rank 0 broadcasts when several processes resume training.
    """
    import numpy
    from fairseq.distributed.utils import _TensorPlaceholder
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    numpy_types: List[object] = [numpy.ndarray, numpy.dtype]
    numpy_types += [
        getattr(numpy.dtypes, name)
        for name in ("Int64DType", "Int32DType", "Float64DType", "Float32DType", "BoolDType")
        if hasattr(numpy, "dtypes") and hasattr(numpy.dtypes, name)
    ]
    multiarray = getattr(numpy, "_core", None) or numpy.core
    numpy_types += [multiarray.multiarray._reconstruct, multiarray.multiarray.scalar]
    return [
        argparse.Namespace,
        *numpy_types,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        typing.Any,
        collections.defaultdict,
        dict,
        list,
        int,
        _TensorPlaceholder,
    ]


def allow_fairseq_checkpoint_globals() -> None:
    """Allow-list :func:`fairseq_checkpoint_globals` for ``torch.load(weights_only=True)``."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads without weights_only by default
        add_safe_globals(fairseq_checkpoint_globals())
    # The plugin's __init__ calls only this function; checkpoints must also be written safely.
    install_atomic_checkpoint_copy()


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
