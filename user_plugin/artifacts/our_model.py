"""Our trained model read back from a checkpoint, for every exporter: the model (eval mode,
CPU) with its ``vaswani_translation`` task on a data directory, and a probe batch that the
exporters run through ours and theirs to verify an export."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..paper import MAX_LEN_OVER_SOURCE
from .builtin_transformer import OUR_MODEL
from .errors import ArtifactError
from .fingerprint import architecture_name


def our_model_name(model_cfg: Any) -> str | None:
    """The registered model behind a checkpoint's ``cfg.model`` (its ``_name`` is the
    architecture, e.g. ``vaswani_base``), or None when no loaded plugin registers it."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    name = architecture_name(model_cfg)
    if name in ARCH_MODEL_NAME_REGISTRY:
        return ARCH_MODEL_NAME_REGISTRY[name]
    return name if name in MODEL_REGISTRY else None


def load_our_model(checkpoint: str | os.PathLike, data_dir: str | os.PathLike,
                   source_lang: str | None = None, target_lang: str | None = None,
                   ) -> tuple[nn.Module, Any, Any]:
    """Our model of ``checkpoint`` (eval mode, CPU), its task on ``data_dir`` and the
    checkpoint's state; an :class:`ArtifactError` for a model that is not ours."""
    from .. import models  # noqa: F401  (registers our model; the task module registers itself)
    from .checkpoints import build_models, read_model_checkpoint, setup_task
    from .model_files import language_pair

    checkpoint, data_dir = Path(checkpoint), Path(data_dir)
    if not data_dir.is_dir():
        raise ArtifactError(f"{data_dir}: no such directory (the data directory of the "
                          "dictionaries, as given to fairseq-generate)")
    state = read_model_checkpoint(checkpoint)
    model_cfg = state["cfg"].model
    name = our_model_name(model_cfg)
    if name != OUR_MODEL:
        raise ArtifactError(
            f"{checkpoint}: model {name or architecture_name(model_cfg)!r} is not {OUR_MODEL}: "
            "fairseq's built-in transformer cannot express an extension's blocks"
        )
    src, tgt = language_pair(data_dir, source_lang, target_lang, state["cfg"].task)
    task = setup_task(state["cfg"].task, data_dir, src, tgt, "gnmt", MAX_LEN_OVER_SOURCE)
    (model,) = build_models(task, [checkpoint], [state], "cpu")
    return model, task, state


def probe_batch(dictionary, length: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A small batch of real (non-special) tokens of ``dictionary``: two sources (one
    left-padded) and their teacher-forced decoder inputs."""
    first = dictionary.nspecial
    symbols = torch.arange(first, min(len(dictionary), first + 2 * length))
    symbols = symbols.repeat(2 * length // max(symbols.numel(), 1) + 1)[: 2 * length]
    pad, eos = dictionary.pad(), dictionary.eos()
    src = torch.full((2, length + 1), pad, dtype=torch.long)
    src[0, :length], src[0, length] = symbols[:length], eos
    src[1, 3:length], src[1, length] = symbols[length: 2 * length - 3], eos
    lengths = src.ne(pad).sum(dim=1)
    prev = torch.cat([torch.full((2, 1), eos), symbols[length:].view(1, -1).repeat(2, 1)], 1)
    return src, lengths, prev
