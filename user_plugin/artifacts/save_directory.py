"""The rules of a training run's save directory, as plain functions that the patch table's
adapters (:mod:`user_plugin.fairseq_patches.save_directory`) call: which temporary files are
orphans of killed saves, whether a checkpoint is intact (its records' CRC-32s, remembered while
the file is unchanged), what a checkpoint holds without reading its tensors, whether a resumed
run would train nothing more, which checkpoint to resume from when the last one is damaged, and
whether a checkpoint fits the run's architecture, data and dictionaries, and which training
settings a resume changes.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ..files.checkpoint_names import is_fairseq_temporary, is_resumable
from .checkpoints import LOAD_ERRORS, checkpoint_file_problem
from .fingerprint import (
    ARCHITECTURE,
    NOT_ARCHITECTURE_OPTIONS,
    architecture_mismatch,
    fingerprint_mismatch,
    has_data,
    stored_fingerprint,
    task_fingerprint,
    with_architecture,
)

logger = logging.getLogger(__name__)

#: The checkpoints found intact, with their size and modification time then.
_verified: dict[Path, tuple[int, int]] = {}


def remove_orphans(directory: Path) -> list[tuple[Path, int]]:
    """Remove the temporary files that killed saves left in ``directory`` (ours, and fairseq's
    ``checkpoint*.pt.tmp``, which nothing else writes while the lock is held); return them
    with their sizes."""
    from ..files.atomic import remove_stale_temporaries

    removed = remove_stale_temporaries(directory)
    for entry in os.scandir(directory):
        if is_fairseq_temporary(entry.name) and entry.is_file(follow_symlinks=False):
            size = entry.stat().st_size
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed.append((Path(entry.path), size))
    return removed


def verified_problem(path: Path) -> str | None:
    """:func:`checkpoint_file_problem` of ``path``, remembered while the file is unchanged (a
    resume reads the file it has just checked)."""
    stat = path.stat()
    key = (stat.st_size, stat.st_mtime_ns)
    if _verified.get(path) == key:
        return None
    problem = checkpoint_file_problem(path)
    if problem is None:
        _verified[path] = key
    return problem


def read_metadata(path: Path) -> dict | None:
    """The checkpoint's state with its tensors memory-mapped (nothing large is read; a file in
    torch's legacy format, which cannot be mapped, is read), or None when it cannot be
    loaded."""
    import torch

    for mmap in (True, False):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except LOAD_ERRORS:
            continue
        return state if isinstance(state, dict) else None
    return None


def num_updates(state: dict) -> int:
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0) or 0)


def finished_reason(state: dict, path: Path, checkpoint_cfg, optimization_cfg) -> str | None:
    """Why resuming ``state`` (read from ``path``) would train nothing more, or None: it
    reached ``--max-update``, or it ends epoch ``--max-epoch``. ``--reset-optimizer`` restarts
    the update count and ``--reset-dataloader`` the epochs, so they make the run go on."""
    max_update = optimization_cfg.max_update or 0
    updates = num_updates(state)
    if max_update > 0 and not checkpoint_cfg.reset_optimizer and updates >= max_update:
        return f"{path} holds update {updates} and --max-update is {max_update}"
    max_epoch = optimization_cfg.max_epoch or 0
    # fairseq saves the end of epoch E as the start of epoch E + 1 (its iterator's state_dict)
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    next_epoch = int(iterator.get("epoch", 1))
    if max_epoch > 0 and not checkpoint_cfg.reset_dataloader and next_epoch > max_epoch:
        return f"{path} holds the end of epoch {next_epoch - 1} and --max-epoch is {max_epoch}"
    return None


def newest_intact(directory: Path, exclude: Path) -> tuple[Path, dict] | None:
    """The checkpoint of ``directory`` (other than ``exclude``) with the most updates whose
    integrity holds, and its state; damaged ones on the way are logged."""
    candidates = []
    for entry in os.scandir(directory):
        path = Path(entry.path)
        if path != exclude and is_resumable(entry.name) and entry.is_file():
            state = read_metadata(path)
            updates = num_updates(state) if state is not None else -1
            interval_first = 0 if "best" in entry.name else 1
            candidates.append((updates, interval_first, entry.name, path, state))
    for _, _, _, path, state in sorted(candidates, key=lambda c: c[:3], reverse=True):
        problem = "cannot be loaded" if state is None else verified_problem(path)
        if problem is None:
            return path, state
        logger.warning(f"{path} is not usable either: {problem}")
    return None


def architecture_change(state: dict, path: Path, model_cfg) -> str | None:
    """The architecture options (:data:`~user_plugin.artifacts.fingerprint.ARCHITECTURE_OPTIONS`)
    whose values in the run's model configuration ``model_cfg`` differ from those ``state``
    (read from ``path``) was trained with, naming each with both values; None when they agree
    or when either configuration is unknown."""
    stored = stored_fingerprint(state)
    if model_cfg is None or stored is None or ARCHITECTURE not in stored:
        return None
    expected = with_architecture(None, model_cfg)
    return architecture_mismatch(expected[ARCHITECTURE], stored[ARCHITECTURE], "this run",
                                 str(path))


def training_data_mismatch(state: dict, path: Path, task) -> str | None:
    """How the data part of the training fingerprint stored in ``state`` (read from ``path``)
    differs from that of the run's ``task`` (same-size dictionaries in another token order,
    swapped languages), naming both; None when they agree or when the checkpoint has none
    (older)."""
    expected = task_fingerprint(task)
    stored = stored_fingerprint(state)
    if expected is None or not has_data(stored):
        return None
    data = getattr(task.cfg, "data", None) or "this run"
    return fingerprint_mismatch(expected, stored, f"the data of this run ({data})", str(path))


def vocabulary_size_problem(state: dict, task) -> str | None:
    """How the embedding tables of a checkpoint's model differ in rows from the task's
    dictionaries' entries (another vocabulary: the load cannot fit the tables), or None."""
    model = state.get("model") or {}
    for side, key, dictionary in (
            ("source", "encoder.embed_tokens.weight", task.source_dictionary),
            ("target", "decoder.embed_tokens.weight", task.target_dictionary)):
        table = model.get(key)
        rows = getattr(table, "shape", (len(dictionary),))[0] if table is not None else None
        if rows is not None and rows != len(dictionary):
            return (f"its {side} embedding has {rows} rows, the {side} dictionary "
                    f"{len(dictionary)} entries: another vocabulary")
    return None


#: The sections of fairseq's configuration whose options a resume may change and announces
#: (the architecture's options are refused instead, by :func:`architecture_change`), and the
#: options of the model and dataset sections that act on training only.
ANNOUNCED_SECTIONS = ("optimization", "optimizer", "lr_scheduler", "criterion")
ANNOUNCED_OPTIONS = {"dataset": ("max_tokens", "batch_size"),
                     "model": tuple(sorted(NOT_ARCHITECTURE_OPTIONS))}
#: Entries that are not settings of their own: copies of ``optimization.lr`` and of the model's
#: width that fairseq interpolates into other sections (announced once, where they are set),
#: and the device flag (a section's registered ``_name`` is announced as ``--<section>``).
_NOT_SETTINGS = frozenset({("optimizer", "lr"), ("lr_scheduler", "lr"),
                           ("lr_scheduler", "model_embed_dim"), ("optimizer", "tpu")})


def _plain(value):
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _shown(value) -> str:
    if isinstance(value, list):
        return ",".join(_shown(item) for item in value)
    return str(value)


def _option(section, name: str):
    """Option ``name`` of a configuration section: a dict or omegaconf config, or the
    ``argparse.Namespace`` that fairseq's legacy models (``--arch transformer``) keep."""
    return getattr(section, name) if isinstance(section, argparse.Namespace) else section[name]


def settings_changes(state: dict, path: Path, cfg) -> list[str]:
    """One line per training setting (optimizer, learning-rate schedule, criterion, batch size,
    dropout...) whose value in the run's configuration ``cfg`` differs from the configuration
    ``state`` (read from ``path``) was trained with, naming the option and both values: a
    resumed run goes on with the new value, and says so. Options either side lacks are
    skipped."""
    stored_cfg = state.get("cfg")
    if not isinstance(stored_cfg, dict) or cfg is None:
        return []
    wanted = {section: None for section in ANNOUNCED_SECTIONS} | ANNOUNCED_OPTIONS
    lines = []
    for section, names in wanted.items():
        stored, current = stored_cfg.get(section), getattr(cfg, section, None)
        if not isinstance(stored, dict) or current is None:
            continue
        for name in names or sorted(stored):
            if (section, name) in _NOT_SETTINGS or name not in stored or name not in current:
                continue
            before, now = _plain(stored[name]), _plain(_option(current, name))
            if before == now or (names is None and isinstance(now, dict)):
                continue
            option = f"--{section.replace('_', '-')}" if name == "_name" else \
                f"--{name.replace('_', '-')}"
            lines.append(f"resuming with {option} {_shown(now)} where {path} was trained "
                         f"with {_shown(before)}")
    return lines
