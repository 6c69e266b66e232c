"""Checkpoint averaging (paper §6.1: "a single model obtained by averaging the last 5
checkpoints"): picking the last N checkpoints of a save directory, and their elementwise mean.

Checkpoints are read one at a time (only one is in memory beside the running
float64 sum); each must have the same parameter names and shapes as the first (otherwise it is
refused as another architecture or vocabulary, naming the parameter and both files) and the same
training fingerprint (:mod:`.fingerprint`: dictionaries of the same token order,
the same language direction, the same architecture options, such as the number of heads, that
leave the shapes alone; otherwise refused, naming both fingerprints or the options and both
values). Checkpoints without a fingerprint (older ones) are averaged with one note line saying
what cannot be checked. Identity is decided by content: a checkpoint holding the same
parameters as an earlier one of the list (``checkpoint_last.pt`` is a byte copy of the last
interval checkpoint; a hard link, or the same file given twice) is used once, and one note line
names it, so the mean is that of the distinct checkpoints: averaging a state with its own copy
would weigh it twice. Floating
point tensors are summed in float64 and the mean is cast back to each tensor's dtype; integer and
boolean buffers are not parameters and must agree across checkpoints. Tensors tied in the first
checkpoint (shared embeddings, §3.4) stay tied in the output. The output keeps the non-parameter
fields (``cfg``, ``optimizer_history``, ...) of the first checkpoint of the list (the newest one
when selecting from a directory), without the optimizer state or EMA copies, so it is about the
size of the model. Every
input is verified before it is used (each record's CRC-32: a damaged file is refused, naming
it). The caller writes the result
(:func:`~.checkpoints.save_checkpoint`: atomic, verified).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from ..files.checkpoint_names import interval_order
from ..files.errors import UserError
from .checkpoints import read_checkpoint
from .fingerprint import KEY as FINGERPRINT_KEY
from .fingerprint import (
    data_part,
    duplicate_note,
    first_mismatch,
    has_data,
    parameters_sha256,
    stored_fingerprint,
    unchecked_note,
)

#: Top-level fields not copied to the averaged checkpoint: the optimizer's moments are as large
#: as the model (twice, for Adam) and mean nothing for the averaged parameters.
DROPPED_FIELDS = ("last_optimizer_state",)
#: ``extra_state`` fields not copied: EMA copies of one checkpoint's model, not averaged.
DROPPED_EXTRA_FIELDS = ("ema", "ema_fp32_params")


def select_checkpoints(directory: Path, count: int, by: str = "update",
                       upper_bound: int | None = None) -> list[Path]:
    """The last ``count`` checkpoints of ``directory``, newest first.

    ``by="update"`` orders ``checkpoint_<epoch>_<update>.pt`` by update number, ``by="epoch"``
    orders ``checkpoint<epoch>.pt`` by epoch; ``upper_bound`` drops those past that update (or
    epoch). Raises :class:`UserError` when fewer than ``count`` remain.
    """
    if by not in ("update", "epoch"):
        raise ValueError(f"by must be 'update' or 'epoch', not {by!r}")
    if count < 1:
        raise UserError(f"the number of checkpoints to average must be >= 1, not {count}")
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory}: no such directory")
    found: list[tuple[tuple[int, ...], Path]] = []
    for path in directory.iterdir():
        order = interval_order(path.name, by)
        if order is None or not path.is_file():
            continue
        if upper_bound is None or order[0] <= upper_bound:
            found.append((order, path))
    found.sort(reverse=True)
    if len(found) < count:
        name = "checkpoint_<epoch>_<update>.pt" if by == "update" else "checkpoint<epoch>.pt"
        bound = f" with {by} <= {upper_bound}" if upper_bound is not None else ""
        raise UserError(f"{directory}: asked for the last {count} {name} files{bound}, "
                        f"found {len(found)}")
    return [path for _, path in found[:count]]


def load_checkpoint(path: Path) -> dict:
    """Load a fairseq checkpoint on the CPU under safe loading, as saved (no upgrade), or raise
    :class:`UserError` naming the file; its ``model`` must be a non-empty dict of tensors."""
    state = read_checkpoint(path)
    model = state["model"]
    if not isinstance(model, dict) or not model:
        raise UserError(f"{path}: the 'model' entry is not a non-empty state dict")
    for key, value in model.items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"{path}: model entry {key!r} is a {type(value).__name__}, "
                            "not a tensor")
    return state


def _storage_key(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """Identifies the memory a tensor views: equal keys mean the tensors are tied."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()))


def _tied_groups(model: dict[str, torch.Tensor]) -> dict[str, str]:
    """Maps each tensor name to the first name (in order) that views the same memory."""
    first_by_storage: dict[tuple, str] = {}
    canonical: dict[str, str] = {}
    for key, tensor in model.items():
        canonical[key] = first_by_storage.setdefault(_storage_key(tensor), key)
    return canonical


def _check_same_layout(key_order: list[str], reference: dict[str, torch.Tensor],
                       model: dict[str, torch.Tensor], first: Path, path: Path) -> None:
    """Refuse a checkpoint whose parameter names or shapes differ from the first one's."""
    missing = [key for key in key_order if key not in model]
    if missing:
        raise UserError(f"{path}: has no parameter {missing[0]!r} that {first} has "
                        f"({len(missing)} missing; another architecture?)")
    extra = [key for key in model if key not in reference]
    if extra:
        raise UserError(f"{path}: has parameter {extra[0]!r} that {first} does not have "
                        f"({len(extra)} extra; another architecture?)")
    for key in key_order:
        want, got = tuple(reference[key].shape), tuple(model[key].shape)
        if want != got:
            raise UserError(f"{path}: parameter {key!r} has shape {list(got)} but {list(want)} "
                            f"in {first} (another architecture or vocabulary?)")


def average_checkpoints(paths: Sequence[Path]) -> dict:
    """The fairseq checkpoint whose parameters are the elementwise mean of those of ``paths``.

    Reads one checkpoint at a time; see the module docstring for the rules. Raises
    :class:`UserError` (one line naming the file) on any unreadable or mismatched checkpoint.
    """
    paths = [Path(path) for path in paths]
    if not paths:
        raise UserError("no checkpoints to average")

    first = paths[0]
    state = load_checkpoint(first)
    model = state.pop("model")
    seen = {parameters_sha256(model): first}
    averaged_from, copies = [first], []
    key_order = list(model)
    canonical = _tied_groups(model)
    # Shapes and dtypes of the first checkpoint, as storage-less tensors, for the checks.
    reference = {key: torch.empty(t.shape, dtype=t.dtype, device="meta")
                 for key, t in model.items()}
    sums: dict[str, torch.Tensor] = {}
    for key in key_order:
        if canonical[key] == key:
            tensor = model[key]
            floating = tensor.is_floating_point()
            sums[key] = tensor.to(torch.float64, copy=True) if floating else tensor
    del model
    for field in DROPPED_FIELDS:
        state.pop(field, None)
    if isinstance(state.get("extra_state"), dict):
        for field in DROPPED_EXTRA_FIELDS:
            state["extra_state"].pop(field, None)

    fingerprints = [(first, stored_fingerprint(state))]
    for path in paths[1:]:
        other_state = load_checkpoint(path)
        other = other_state.pop("model")
        _check_same_layout(key_order, reference, other, first, path)
        fingerprints.append((path, stored_fingerprint(other_state)))
        del other_state
        mismatch = first_mismatch(fingerprints)
        if mismatch is not None:
            raise UserError(f"cannot average: {mismatch}")
        digest = parameters_sha256(other)
        if digest in seen:  # a copy (checkpoint_last.pt of the last interval checkpoint...)
            copies.append((path, seen[digest]))
            continue
        seen[digest] = path
        averaged_from.append(path)
        for key in key_order:
            tensor = other[key]
            if canonical[key] != key:
                tied = other[canonical[key]]
                if _storage_key(tensor) != _storage_key(tied) and not torch.equal(tensor, tied):
                    raise UserError(f"{path}: parameters {canonical[key]!r} and {key!r} are "
                                    f"tied in {first} but differ here")
            elif reference[key].is_floating_point():
                if not tensor.is_floating_point():
                    raise UserError(f"{path}: parameter {key!r} is {tensor.dtype}, "
                                    f"floating point in {first}")
                sums[key] += tensor
            elif not torch.equal(sums[key], tensor):
                raise UserError(f"{path}: {sums[key].dtype} buffer {key!r} differs from {first}'s"
                                " (integer and boolean buffers are not averaged)")
        del other

    averaged: dict[str, torch.Tensor] = {}
    for key in key_order:
        if canonical[key] != key:
            averaged[key] = averaged[canonical[key]]
        elif reference[key].is_floating_point():
            averaged[key] = sums.pop(key).div_(len(averaged_from)).to(reference[key].dtype)
        else:
            averaged[key] = sums.pop(key)
    state["model"] = averaged
    state["averaged_from"] = [path.name for path in averaged_from]
    trained_on = next((data_part(found) for _, found in fingerprints if has_data(found)), None)
    if trained_on is not None:
        state[FINGERPRINT_KEY] = trained_on
    for note in (unchecked_note(fingerprints),
                 duplicate_note(copies, len(averaged_from)) if copies else None):
        if note is not None:
            print(note, file=sys.stderr, flush=True)
    return state
