"""Let fairseq's checkpoint loaders work under torch's ``weights_only`` safe loading.

Since torch 2.6, ``torch.load`` refuses to unpickle anything but tensors and plain containers
unless the type is allow-listed. fairseq's loaders do not pass ``weights_only``, so a checkpoint
holding, say, a numpy scalar from ``--eval-bleu`` meters fails to load in ``fairseq-generate``.
This module imports nothing of the plugin, so that low-level readers (``artifacts.checkpoints``)
can use it.

Rather than switching safe loading off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), this module
allow-lists exactly the types fairseq's own checkpoints contain. The plugin's ``__init__`` calls
:func:`allow_fairseq_checkpoint_globals`, which runs before any checkpoint is read in every
fairseq entry point that takes ``--user-dir`` and in every spawned training process.
"""

from __future__ import annotations

import argparse
import collections
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


_ALLOWED: List[bool] = []


def allow_fairseq_checkpoint_globals() -> None:
    """Allow-list :func:`fairseq_checkpoint_globals` for ``torch.load(weights_only=True)``, once
    per process (the plugin's registration and the checkpoint reader of ``files`` both ask)."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None and not _ALLOWED:  # torch < 2.4: no weights_only default
        add_safe_globals(fairseq_checkpoint_globals())
        _ALLOWED.append(True)
