"""What a training run keeps in its save directory, recognised without building anything, so
that no command writes over it.

fairseq-train keeps a run's whole state in its ``--save-dir``: checkpoints that hold the
optimizer's state (the top-level entry ``last_optimizer_state``) under the names fairseq gives
them (:func:`~.checkpoint_names.is_run_checkpoint`: ``checkpoint_last.pt``, ``checkpoint_best.pt``,
``checkpoint<epoch>.pt``, ``checkpoint_<epoch>_<update>.pt``,
``checkpoint.best_<metric>_<value>.pt``, with a shard suffix in sharded runs), and, while a
run holds the directory, its lock :data:`TRAINING_LOCK`. A run resumes from
``checkpoint_last.pt``, or (with the plugin) from the newest intact checkpoint of those names.

An output path is a **training checkpoint** (:func:`training_checkpoint_problem`) when

* it is an existing file holding an optimizer state (whatever its name): replacing it loses the
  state a run resumes from; or
* it has one of fairseq's checkpoint names inside a **save directory**: one that holds the lock
  of a training run, or another file of those names holding an optimizer state. A file written
  there under such a name is what the next resume (or an average of the last checkpoints) would
  read, although it is not a training state. ``SAVE_DIR/checkpoint_last.pt`` of a live, killed
  or finished run is caught by both rules; ``SAVE_DIR/checkpoint_avg.pt`` (the paper's average,
  a name fairseq never gives) is not a training checkpoint.

Whether a file holds an optimizer state is read from the pickle record of its zip archive
(``torch.save``'s format) by :func:`checkpoint_entries`, which builds nothing the file names
(no code of the file runs, no tensor is read): it needs neither torch nor fairseq, and costs a
read of a few kilobytes. A file in torch's legacy format, or not a torch file at all, holds no
optimizer state as far as this module is concerned (the name rule still applies).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path

from .checkpoint_names import is_run_checkpoint

#: The lock file of a training run's save directory (taken by
#: ``user_plugin.fairseq_patches.save_directory``).
TRAINING_LOCK = ".vaswani-train.lock"
#: The largest pickle record read to find a checkpoint's entries (fairseq's are kilobytes:
#: tensors are stored in records of their own).
MAX_PICKLE_BYTES = 64 << 20


class _Opaque(dict):
    """Stands for every object a checkpoint's pickle would build: accepts any arguments and
    state and drops them (items set on it are kept, so an ordered dict reads as a dict); no
    class or function the file names is ever imported or called."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def __setstate__(self, state) -> None:
        pass

    def append(self, item) -> None:
        pass

    def extend(self, items) -> None:
        pass


class _EntriesUnpickler(pickle.Unpickler):
    """Reads the containers of a pickle (dicts, lists, strings, numbers) and replaces every
    object of a named class or function by :class:`_Opaque`, and every tensor storage by None."""

    def find_class(self, module: str, name: str):
        return _Opaque

    def persistent_load(self, pid):
        return None


def checkpoint_entries(path: str | os.PathLike) -> Mapping | None:
    """The top-level dict of the ``torch.save`` zip archive ``path``, its objects replaced by
    placeholders and its tensors by None (nothing of the file is built or run), or None when
    ``path`` is not such an archive or cannot be read."""
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as archive:
            records = [info for info in archive.infolist()
                       if info.filename.count("/") == 1 and info.filename.endswith("/data.pkl")]
            if len(records) != 1 or records[0].file_size > MAX_PICKLE_BYTES:
                return None
            data = archive.read(records[0])
        state = _EntriesUnpickler(io.BytesIO(data)).load()
    except Exception:  # an unreadable, foreign or damaged file holds no state we can see
        return None
    return state if isinstance(state, dict) else None


def holds_optimizer_state(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a checkpoint holding an optimizer state (a training checkpoint)."""
    entries = checkpoint_entries(path)
    return entries is not None and entries.get("last_optimizer_state") is not None


def save_directory_evidence(directory: str | os.PathLike,
                            exclude: str | os.PathLike | None = None) -> str | None:
    """Why ``directory`` is the save directory of a training run (it holds the run's lock, or
    a checkpoint of fairseq's names holding an optimizer state, other than ``exclude``), or
    None when it is not one (or cannot be listed)."""
    directory = Path(directory)
    if (directory / TRAINING_LOCK).exists():
        return f"it holds the lock of a training run, {TRAINING_LOCK}"
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return None
    for entry in entries:
        if not is_run_checkpoint(entry.name) or not entry.is_file():
            continue
        if exclude is not None and os.path.realpath(entry.path) == os.path.realpath(exclude):
            continue
        if holds_optimizer_state(entry.path):
            return f"{entry.name} there holds an optimizer state"
    return None


def training_checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why writing ``path`` would replace or shadow the state of a training run (see the
    module's description), in words that follow the path; None when it would not."""
    path = Path(path)
    if path.is_file() and holds_optimizer_state(path):
        return ("is a training checkpoint (it holds an optimizer state, which a training run "
                "resumes from)")
    if is_run_checkpoint(path.name):
        evidence = save_directory_evidence(path.parent if str(path.parent) else ".", path)
        if evidence is not None:
            return (f"is a name fairseq-train gives the checkpoints it resumes from, in the save "
                    f"directory of a training run ({evidence})")
    return None
