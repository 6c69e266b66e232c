"""Checkpoints, the trained-model files of fairseq: reading, checking (CRC) and writing them,
with one-line errors that name the file; and, for translation and export, a checkpoint of ours
with its ``vaswani_translation`` task on a data directory and the models built from both (each
failure one :class:`~.errors.ArtifactError` line naming the file).

A checkpoint is first checked without unpickling it (:func:`checkpoint_file_problem`: empty,
truncated, foreign format, and :func:`checkpoint_integrity_problem`: every record's CRC-32),
then loaded to the CPU under torch's ``weights_only`` safe loading, with the types fairseq
checkpoints hold allow-listed (:mod:`user_plugin.safe_loading`).
Whatever goes wrong becomes a :class:`CheckpointError` naming the file.

Integrity: ``torch.save`` writes a zip archive (since torch 1.6) in which every record (the
pickle and each tensor's storage) carries the CRC-32 of its bytes. Reading every record back
and comparing (``zipfile``'s ``testzip``, streamed in 1 MiB blocks, about as fast as the disk)
catches flipped, zeroed or overwritten bytes inside an archive whose structure is intact, which
``torch.load`` itself does not check. No digest file is written beside checkpoints: every
checkpoint this stack writes (fairseq's saves, the averager, the export) is such an archive,
and a digest beside it would be lost or left stale by the copies that fairseq, the recipes and
users make. Files in torch's legacy format (before 1.6) carry no checksum and are only sniffed.

:func:`save_checkpoint` writes one atomically, reports a full disk as one line, and verifies
the archive before moving it into place. :func:`state_dict_mismatch` says how a checkpoint's
parameters differ from a model's.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..files.atomic import atomic_write
from ..files.errors import UserError, file_error, first_line
from .errors import ArtifactError
from .fingerprint import distinct_parameters, duplicate_note, parameters_sha256

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


def checkpoint_file_problem(path: str | os.PathLike, verify: bool = True) -> str | None:
    """What is wrong with a checkpoint file without unpickling it, or None.

    Reads the first bytes and, for a zip, its central directory (at the end of the file): an
    empty file, a foreign format and a truncated zip (a copy or write cut short) are told apart.
    With ``verify`` (the default) the records of a zip are then read back and checked against
    their CRC-32 (:func:`checkpoint_integrity_problem`). ``OSError`` (a missing file, a
    directory...) propagates.
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
        return checkpoint_integrity_problem(path) if verify else None
    if not head.startswith(PICKLE_MAGIC):
        return f"not a PyTorch file (unknown format, starts with {head!r})"
    return None


#: What reading a damaged zip archive raises: a broken header or directory (BadZipFile), a
#: damaged compressed record (zlib.error), fields that make no sense (struct.error, ValueError,
#: EOFError, NotImplementedError for an unknown compression method).
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, ValueError, EOFError,
              NotImplementedError)


def checkpoint_integrity_problem(path: str | os.PathLike) -> str | None:
    """None when every record of the zip archive ``path`` (a ``torch.save`` file) reads back
    with the CRC-32 its archive recorded, else what is wrong: a record whose bytes changed, or
    a damaged archive structure. ``OSError`` (unreadable file) propagates."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except ZIP_ERRORS as error:
        return f"corrupt: damaged zip archive, {first_line(error)}"
    if bad is not None:
        return f"corrupt: record {bad!r} fails its CRC-32 check, its bytes changed after writing"
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


def load_error(path: str | os.PathLike, error: BaseException, upgrade: bool) -> UserError:
    """The one-line error for one of :data:`LOAD_ERRORS` raised while loading ``path`` (with
    fairseq's ``upgrade`` of old layouts, or as saved): a missing, unreadable file names the
    OS error; a field that fairseq's upgrade did not find means a file that is not a fairseq
    checkpoint; anything else is a :class:`CheckpointError` with the error's first sentence."""
    if isinstance(error, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return file_error(path, error, expected="a checkpoint file")
    if isinstance(error, KeyError) and upgrade:
        return CheckpointError(path, f"not a fairseq checkpoint (no {error} entry)")
    return CheckpointError(path, _load_error_reason(error), unreadable=True)


def refuse_unusable_file(path: str | os.PathLike, verify: bool = True) -> None:
    """Raise a one-line error naming ``path`` when it is no usable checkpoint file (checked
    without unpickling it, :func:`checkpoint_file_problem`): the file error of one that cannot be
    opened, else a :class:`CheckpointError`."""
    try:
        problem = checkpoint_file_problem(path, verify=verify)
    except OSError as error:
        raise file_error(path, error, expected="a checkpoint file") from None
    if problem is not None:
        raise CheckpointError(path, problem, unreadable=True)


def read_checkpoint(path: str | os.PathLike, upgrade: bool = False, mmap: bool = False,
                    required: Sequence[str] = ("model",), verify: bool = True) -> dict:
    """Load the fairseq checkpoint ``path`` to the CPU under safe loading, after checking its
    integrity (:func:`checkpoint_file_problem`; ``verify=False`` skips the CRC-32 check, for a
    reader that needs only the configuration of a file checked elsewhere).

    ``upgrade`` loads it through fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``, which
    brings checkpoints of older fairseq versions to the current layout (``args`` to ``cfg`` ...)
    as fairseq's own loaders do; without it the state is returned as saved (to average or
    inspect it). ``mmap`` maps the tensors' storage instead of reading it (without ``upgrade``).
    Every entry of ``required`` must be present and not None.

    Raises a one-line :class:`~user_plugin.files.errors.UserError` naming the file: from
    :func:`~user_plugin.files.errors.file_error` when it cannot be opened, a
    :class:`CheckpointError` when it is not a usable checkpoint.
    """
    refuse_unusable_file(path, verify=verify)
    from ..safe_loading import allow_fairseq_checkpoint_globals

    allow_fairseq_checkpoint_globals()  # the types fairseq checkpoints hold

    try:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True,
                           mmap=mmap and not upgrade)
        if upgrade:
            state = upgraded(state)
    except LOAD_ERRORS as error:
        raise load_error(path, error, upgrade) from None
    entries = state if isinstance(state, dict) else {}
    for key in required:
        if entries.get(key) is None:
            raise CheckpointError(path, f"not a fairseq checkpoint (no {key!r} entry)")
    return state


def upgraded(state: dict) -> dict:
    """A checkpoint's state as fairseq's ``load_checkpoint_to_cpu`` returns it, from the
    bytes already read: its configuration as an omegaconf config (objects allowed, as fairseq
    allows the ``argparse.Namespace`` of legacy models) and fairseq's upgrade of older layouts
    (``args`` to ``cfg`` ...). Reading the file once here, rather than calling fairseq's loader
    (which the plugin's patch table wraps to verify what it reads), reads and checks each
    checkpoint once per load."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    if isinstance(state, dict) and state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
    return checkpoint_utils._upgrade_state_dict(state)


class _WriteErrorRecorder:
    """A binary file's ``write`` that remembers the first ``OSError`` it raised: ``torch.save``
    reports a failed write (a full disk) as an uninformative ``RuntimeError`` of its zip
    writer, and the recorded error says what happened."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.handle.flush()


def torch_save(state: dict, path: str | os.PathLike) -> None:
    """``torch.save(state, path)``, except that a failed write (a full disk...) raises the
    ``OSError`` that happened, which :func:`~user_plugin.files.atomic.atomic_write` turns into
    one line, rather than the ``RuntimeError`` of torch's zip writer."""
    import torch

    with open(path, "wb") as handle:
        recorder = _WriteErrorRecorder(handle)
        try:
            torch.save(state, recorder)
        except RuntimeError:
            if recorder.error is not None:
                raise recorder.error from None
            raise


def save_checkpoint(state: dict, path: str | os.PathLike, verify: bool = True,
                    inputs: Sequence[str | os.PathLike] = (), training_save: bool = False) -> None:
    """Write ``state`` with ``torch.save`` to ``path`` atomically (a temporary file beside it,
    then ``os.replace``).

    With ``verify`` (the default) the written archive is read back and checked
    (:func:`checkpoint_file_problem`) before it is moved into place. A failed write (a full
    disk, a read-only file system...) or a failed check is a one-line :class:`UserError`
    naming ``path``; nothing is left behind and ``path`` keeps its old content. A ``path``
    that is, holds or lies inside one of ``inputs``, or is a training checkpoint (unless
    ``training_save``: a training run saving its own state), is refused before anything is
    written (:func:`~user_plugin.files.atomic.refuse_input_clash`).
    """

    def write(temp: str) -> None:
        torch_save(state, temp)
        if verify:
            problem = checkpoint_file_problem(temp)
            if problem is not None:
                raise UserError(f"{path}: the written checkpoint does not read back: {problem}")

    atomic_write(path, write, inputs, training_save)


def _shape(tensor) -> list[int]:
    return list(getattr(tensor, "shape", ()))


def state_dict_mismatch(model: Mapping, checkpoint: Mapping, model_name: str = "the model",
                        checkpoint_name: str = "the checkpoint") -> str | None:
    """How the parameter names and shapes of a checkpoint's state dict differ from a model's,
    in one sentence naming the first difference (and both shapes), or None when they agree."""
    missing = [key for key in model if key not in checkpoint]
    if missing:
        return (f"{checkpoint_name} has no parameter {missing[0]!r} that {model_name} has "
                f"({len(missing)} missing: another architecture?)")
    extra = [key for key in checkpoint if key not in model]
    if extra:
        return (f"{checkpoint_name} has parameter {extra[0]!r} that {model_name} does not have "
                f"({len(extra)} extra: another architecture?)")
    for key, tensor in model.items():
        want, got = _shape(tensor), _shape(checkpoint[key])
        if want != got:
            return (f"parameter {key!r} has shape {got} in {checkpoint_name} but {want} in "
                    f"{model_name} (another vocabulary or architecture?)")
    return None


# -- our trained models: a checkpoint with its task and models (translation, export) ----------

logger = logging.getLogger(__name__)


def read_model_checkpoint(path: Path, verify: bool = True) -> dict:
    """A checkpoint with its ``cfg`` and ``model``, upgraded by fairseq as its loaders do; a
    :class:`ArtifactError` (``cannot read checkpoint PATH: ...``) when it cannot be used.
    ``verify=False``: its records' CRC-32s are not checked again (a package's files were
    checked by sha256 against its manifest)."""
    try:
        return read_checkpoint(path, upgrade=True, required=("cfg", "model"), verify=verify)
    except CheckpointError as error:
        raise ArtifactError(f"cannot read checkpoint {error.path}: {error.problem}") from None
    except UserError as error:
        raise ArtifactError(str(error)) from None


def setup_task(task_cfg, data_dir: Path, source_lang: str, target_lang: str,
               length_penalty_form: str, max_len_over_source: int):
    """The ``vaswani_translation`` task of a checkpoint's task configuration, on ``data_dir``
    and the given languages and decoding settings, without validation BLEU."""
    from fairseq import tasks
    from omegaconf import open_dict

    with open_dict(task_cfg):
        from ..tasks.vaswani_translation import TASK_NAME

        task_cfg._name = TASK_NAME
        task_cfg.data = str(data_dir)
        task_cfg.source_lang, task_cfg.target_lang = source_lang, target_lang
        task_cfg.length_penalty_form = length_penalty_form
        task_cfg.max_len_over_source = max_len_over_source
        task_cfg.eval_bleu = False
    try:
        return tasks.setup_task(task_cfg)
    except LOAD_ERRORS as exc:
        raise ArtifactError(
            f"cannot set up the task on {data_dir}: {first_line(exc, with_type=True)}"
        ) from None


def parameter_mismatch(task, state: dict) -> str | None:
    """How a checkpoint's parameters differ from those of the model its configuration builds on
    ``task`` (the dictionaries of the data directory), naming the first parameter and both
    shapes; None when they agree or the model cannot be built."""
    try:
        model = task.build_model(state["cfg"].model)
    except LOAD_ERRORS:
        return None
    data = getattr(task.cfg, "data", "the data directory")
    return state_dict_mismatch(model.state_dict(), state["model"],
                               f"the model for the dictionaries of {data}", "the checkpoint")


def build_models(task, paths: Sequence[Path], states: Sequence[dict], device: str) -> list:
    """The model of each checkpoint (already read into ``states``), on ``device``, in eval
    mode; a checkpoint holding the same parameters as an earlier one (a copy) is used once,
    with one note line, since an ensemble weighs each model it holds. A checkpoint that does
    not fit (another vocabulary than the dictionaries...) is a :class:`ArtifactError` naming
    the first mismatched parameter and both shapes."""
    from fairseq import checkpoint_utils

    if len(paths) > 1:
        kept, dropped = distinct_parameters(
            [(path, parameters_sha256(state["model"])) for path, state in zip(paths, states)])
        if dropped:
            logger.warning(duplicate_note(dropped, len(kept)))
        paths, states = [paths[i] for i in kept], [states[i] for i in kept]
    models = []
    for path, state in zip(paths, states):
        try:
            loaded, _, _ = checkpoint_utils.load_model_ensemble_and_task(
                [str(path)], task=task, state=state
            )
        except LOAD_ERRORS as exc:
            reason = parameter_mismatch(task, state) or first_line(exc, with_type=True)
            raise ArtifactError(f"cannot build the model of {path}: {reason}") from None
        model = loaded[0].to(device)
        model.eval()
        models.append(model)
    return models
