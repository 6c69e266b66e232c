"""Reading fairseq checkpoint files, with one-line errors that name the file.

A checkpoint is first sniffed without unpickling it (:func:`checkpoint_file_problem`: empty,
truncated, foreign format), then loaded to the CPU under torch's ``weights_only`` safe loading
(the plugin's ``__init__``, run by any import of this package, allow-lists the types fairseq
checkpoints hold). Whatever goes wrong becomes a :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

from .errors import UserError, file_error, first_line

#: What ``torch.load`` and fairseq's checkpoint upgrade raise for truncated, empty, foreign or
#: unsafe files: zip reader errors are RuntimeErrors, pickle garbage an UnpicklingError, an
#: empty pickle an EOFError, a refused global an UnpicklingError, an old or foreign layout a
#: KeyError/AttributeError/TypeError/IndexError, a pickled class that no longer exists an
#: ImportError (or AttributeError).
LOAD_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, OSError, TypeError,
               AttributeError, KeyError, IndexError, ImportError)

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6
PICKLE_MAGIC = b"\x80"  # the legacy torch.save format starts with a pickle protocol opcode


class CheckpointError(UserError):
    """A checkpoint file that cannot be used.

    ``path`` is the file and ``problem`` what is wrong with it, without the file name, so that a
    caller can word its own line; the message is ``PATH: not a readable PyTorch checkpoint
    (PROBLEM)`` for a file torch cannot load (``unreadable``), ``PATH: PROBLEM`` otherwise.
    """

    def __init__(self, path: str | os.PathLike, problem: str, unreadable: bool = False) -> None:
        self.path = Path(path)
        self.problem = problem
        self.unreadable = unreadable
        what = f"not a readable PyTorch checkpoint ({problem})" if unreadable else problem
        super().__init__(f"{path}: {what}")


def checkpoint_file_problem(path: str | os.PathLike) -> str | None:
    """What is visibly wrong with a checkpoint file without unpickling it, or None.

    Reads the first bytes and, for a zip, its central directory (at the end of the file): an
    empty file, a foreign format and a truncated zip (a copy or write cut short) are told apart.
    ``OSError`` (a missing file, a directory...) propagates.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return "empty file (0 bytes)"
    with open(path, "rb") as handle:
        head = handle.read(len(ZIP_MAGIC))
    if head == ZIP_MAGIC:
        if not zipfile.is_zipfile(path):
            return f"truncated or corrupt (an incomplete zip archive of {size} bytes)"
        return None
    if not head.startswith(PICKLE_MAGIC):
        return f"not a PyTorch file (unknown format, starts with {head!r})"
    return None


def _load_error_reason(error: BaseException) -> str:
    """A short reason for a failed load: the refused type for files that safe loading refuses,
    else the error's type and the first sentence of its message (a truncated zip explains at
    length)."""
    unsafe = re.search(r"Unsupported global: [^\n]*", str(error))
    if unsafe:
        return f"refused by safe loading: {unsafe.group(0).split('. ')[0]}"
    message = first_line(error)
    if message == type(error).__name__:
        return message
    return f"{type(error).__name__}: {message.split('. ')[0]}"


def read_checkpoint(path: str | os.PathLike, upgrade: bool = False, mmap: bool = False,
                    required: Sequence[str] = ("model",)) -> dict:
    """Load the fairseq checkpoint ``path`` to the CPU under safe loading.

    ``upgrade`` loads it through fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``, which
    brings checkpoints of older fairseq versions to the current layout (``args`` to ``cfg`` ...)
    as fairseq's own loaders do; without it the state is returned as saved (to average or
    inspect it). ``mmap`` maps the tensors' storage instead of reading it (without ``upgrade``).
    Every entry of ``required`` must be present and not None.

    Raises a one-line :class:`~user_plugin.files.errors.UserError` naming the file: from
    :func:`~user_plugin.files.errors.file_error` when it cannot be opened, a
    :class:`CheckpointError` when it is not a usable checkpoint.
    """
    try:
        problem = checkpoint_file_problem(path)
    except OSError as error:
        raise file_error(path, error, expected="a checkpoint file") from None
    if problem is not None:
        raise CheckpointError(path, problem, unreadable=True)
    from .. import registration  # noqa: F401  (the types fairseq checkpoints hold, allowed)

    try:
        if upgrade:
            from fairseq import checkpoint_utils

            state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
        else:
            import torch

            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except KeyError as error:
        if not upgrade:
            raise CheckpointError(path, _load_error_reason(error), unreadable=True) from None
        # fairseq's upgrade of an old checkpoint did not find one of its fields
        raise CheckpointError(path, f"not a fairseq checkpoint (no {error} entry)") from None
    except (FileNotFoundError, IsADirectoryError, PermissionError) as error:
        raise file_error(path, error, expected="a checkpoint file") from None
    except LOAD_ERRORS as error:
        raise CheckpointError(path, _load_error_reason(error), unreadable=True) from None
    entries = state if isinstance(state, dict) else {}
    for key in required:
        if entries.get(key) is None:
            raise CheckpointError(path, f"not a fairseq checkpoint (no {key!r} entry)")
    return state
