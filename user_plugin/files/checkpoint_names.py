"""fairseq's checkpoint file names, in one grammar: what every layer that looks at a save
directory (the resume rules, the output rule, the averager, the recipes' step engine) parses.

fairseq-train writes ``checkpoint_last.pt``, ``checkpoint_best.pt``, ``checkpoint<epoch>.pt``
(end of an epoch), ``checkpoint_<epoch>_<update>.pt`` (every ``--save-interval-updates``) and
``checkpoint.best_<metric>_<value>.pt`` (``--keep-best-checkpoints``), each with an optional
``-<suffix>`` of sharded or model-parallel runs, and writes each through ``NAME.tmp``.
"""

from __future__ import annotations

import re

#: The checkpoint a run resumes from by default, and the one it overwrites at every save.
LAST = "checkpoint_last.pt"
#: Every name fairseq-train gives the checkpoints of a run (with a shard suffix).
RUN_CHECKPOINT = re.compile(r"checkpoint(_last|_best|\d+|_\d+_\d+|\.best_.+?)(-[^/]+)?\.pt")
#: The checkpoints a run can resume from, besides ``checkpoint_last.pt``.
RESUMABLE = re.compile(r"checkpoint(\d+|_\d+_\d+|_best|\.best_.+)\.pt")
#: An interval checkpoint: epoch, update.
UPDATE_CHECKPOINT = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
#: An end-of-epoch checkpoint: epoch.
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")
#: fairseq's own temporary checkpoint files (``torch_persistent_save`` writes ``NAME.tmp``).
FAIRSEQ_TEMPORARY = re.compile(r"checkpoint.*\.pt\.tmp")
#: Any file named as a checkpoint (an average or a copy included): training work.
ANY_CHECKPOINT = re.compile(r"checkpoint.*\.pt")


def is_run_checkpoint(name: str) -> bool:
    """Whether ``name`` is one fairseq-train gives a checkpoint of a run."""
    return RUN_CHECKPOINT.fullmatch(name) is not None


def is_resumable(name: str) -> bool:
    """Whether a run can resume from ``name`` (besides :data:`LAST`)."""
    return RESUMABLE.fullmatch(name) is not None


def is_fairseq_temporary(name: str) -> bool:
    """Whether ``name`` is fairseq's temporary file of a checkpoint being written."""
    return FAIRSEQ_TEMPORARY.fullmatch(name) is not None


def looks_like_checkpoint(name: str) -> bool:
    """Whether ``name`` is named as a checkpoint (``checkpoint*.pt``)."""
    return ANY_CHECKPOINT.fullmatch(name) is not None


def last_checkpoint(suffix: str = "") -> str:
    """The name of the last checkpoint of a run whose checkpoints carry ``suffix``."""
    return f"checkpoint_last{suffix}.pt"


def interval_order(name: str, by: str) -> tuple[int, ...] | None:
    """Where ``name`` stands among a run's interval checkpoints: ``(update, epoch)`` of
    ``checkpoint_<epoch>_<update>.pt`` (``by="update"``), ``(epoch,)`` of
    ``checkpoint<epoch>.pt`` (``by="epoch"``); None for any other name."""
    match = (UPDATE_CHECKPOINT if by == "update" else EPOCH_CHECKPOINT).fullmatch(name)
    if match is None:
        return None
    numbers = tuple(int(group) for group in match.groups())
    return (numbers[1], numbers[0]) if by == "update" else numbers
