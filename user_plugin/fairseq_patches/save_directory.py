"""A training run's save directory: one writer, final means final, intact resumes, no orphans.

This module adapts fairseq: its wrappers hold the lock and decide at fairseq's call sites; the
rules they apply are plain functions of :mod:`user_plugin.artifacts.save_directory`.

fairseq-train keeps a run's whole state in its ``--save-dir``; a rerun of the same command
resumes from ``checkpoint_last.pt``. :mod:`user_plugin.fairseq_patches` (when the plugin is
imported) wraps five of fairseq's ``checkpoint_utils`` functions, which ``fairseq_cli.train``
and the trainer look up there at call time, so that:

* **One writer per save directory.** The process of global rank 0 takes the directory's lock
  (:class:`~user_plugin.files.lock.DirectoryLock`,
  :data:`~user_plugin.files.training_state.TRAINING_LOCK`) when fairseq first checks the
  directory, before anything is built or written; a second training on the same directory stops
  there with one line naming the holder, and changes nothing. Other ranks never
  touch the lock. A killed run's lock is released by the kernel, and the next run takes it over
  and says so.
* **No orphans.** Holding the lock, rank 0 removes what killed saves left behind: temporary
  files of the plugin's atomic writes and fairseq's ``checkpoint*.pt.tmp``.
* **Final means final.** Before loading, rank 0 reads the checkpoint fairseq would resume from.
  When it already reached ``--max-update`` (or ends epoch ``--max-epoch``), every rank stops at
  once with exit status 0 and one line: nothing is loaded into the trainer and nothing is
  written, so every file stays byte-identical. ``--reset-optimizer`` (the update count starts
  again from 0) and ``--reset-dataloader`` (the epochs do) make it a new phase of training,
  which runs.
* **Intact resumes.** That checkpoint is verified first (zip CRC-32s,
  :func:`~user_plugin.artifacts.checkpoints.checkpoint_file_problem`). A damaged or missing
  ``checkpoint_last.pt`` next to other checkpoints makes the run resume from the newest intact
  one, saying which; with none intact it stops with one line. A checkpoint whose parameters do
  not fit the model being trained (another vocabulary...) is one line naming the parameter and
  both shapes, not a traceback.
* **Saves fail in one line.** Checkpoints are written by
  :func:`~user_plugin.artifacts.checkpoints.save_checkpoint` (atomic; a full disk is one line and
  leaves no partial file; the previous checkpoints stay intact).
* **What a checkpoint was trained on travels with it.** Every checkpoint saved holds the run's
  training fingerprint (:mod:`~user_plugin.artifacts.fingerprint`: the sha256 of each dictionary's
  token order, and the language direction) under the top-level key
  :data:`~user_plugin.artifacts.fingerprint.KEY`, added to the state fairseq saves. A resume on
  data whose fingerprint differs (same-size dictionaries in another order, swapped languages)
  is one line naming both fingerprints, and so is a resume with other architecture options
  that leave the shapes alone (4 heads resumed with 8...: the fingerprint's architecture
  part, read from ``cfg.model``), naming each option with both values;
  ``load_model_ensemble_and_task`` (fairseq-generate's ``--path a:b`` ensembles, the hub, the
  export) refuses checkpoints whose fingerprints differ from each other or whose dictionaries
  differ from the data's, and uses a checkpoint holding the same parameters as an earlier one
  once (one note line). A checkpoint without a fingerprint (older) is used with one note line
  saying what cannot be checked.
* **An interrupt says what was left.** Ctrl-C in a run that holds its save directory prints
  one line naming the last checkpoint saved (intact: saves are atomic) and that rerunning the
  same command resumes from it, or that none was saved yet (:func:`interrupted_note`).
* **Every checkpoint fairseq reads is verified**, in every command that loads the plugin
  (``fairseq-generate``, ``fairseq-interactive``...): a damaged, truncated or foreign file is
  one line naming it.

Rank 0 decides and broadcasts its decision, so every rank of a distributed run does the same.
Checkpoints with a suffix (sharded or model-parallel states) and an explicit ``--restore-file``
are verified but never replaced by another checkpoint.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from pathlib import Path

from ..artifacts.checkpoints import (
    LOAD_ERRORS,
    CheckpointError,
    load_error,
    refuse_unusable_file,
    save_checkpoint,
    state_dict_mismatch,
)
from ..artifacts.fingerprint import KEY as FINGERPRINT_KEY
from ..artifacts.fingerprint import (
    dictionary_mismatch,
    distinct_parameters,
    duplicate_note,
    ensemble_mismatch,
    has_data,
    parameters_sha256,
    stored_fingerprint,
    task_fingerprint,
    unchecked_note,
)
from ..artifacts.save_directory import (
    architecture_change,
    finished_reason,
    newest_intact,
    num_updates,
    read_metadata,
    remove_orphans,
    settings_changes,
    training_data_mismatch,
    verified_problem,
    vocabulary_size_problem,
)
from ..files.checkpoint_names import (
    LAST,
    last_checkpoint,
)
from ..files.errors import UserError, file_error, on_interrupt
from ..files.lock import DirectoryLock
from ..files.training_state import TRAINING_LOCK

logger = logging.getLogger(__name__)


_locks: dict[Path, DirectoryLock] = {}
#: The training fingerprint of this process's run (its task's dictionaries and languages),
#: written into every checkpoint it saves.
_run_fingerprint: dict[str, str] | None = None


# ---------------------------------------------------------------------------------------------
# The save directory: lock and orphans


def claim_save_dir(save_dir: str | os.PathLike) -> DirectoryLock:
    """Take the lock of ``save_dir`` for this process (once; later calls return it) and remove
    the orphaned temporary files in it. Raises
    :class:`~user_plugin.files.lock.DirectoryInUse` when another live run holds it."""
    directory = Path(save_dir).resolve()
    if directory in _locks and _locks[directory].held:
        return _locks[directory]
    lock = DirectoryLock.acquire(directory, TRAINING_LOCK, "training run")
    _locks[directory] = lock
    on_interrupt(interrupted_note)
    if lock.previous_holder:
        logger.info(f"took over the lock of {directory}: its holder ended without releasing it "
                    f"({lock.previous_holder})")
    for path, size in remove_orphans(directory):
        logger.info(f"removed {path.name} ({size:,} bytes), a partial file of a killed save")
    return lock


def interrupted_note() -> str | None:
    """What an interrupt (Ctrl-C) leaves of the run whose save directory this process holds:
    its last checkpoint, which a rerun of the same command resumes from (saves are atomic, so
    a save cut short left nothing), or that none was saved yet; None when it holds none."""
    held = [directory for directory, lock in _locks.items() if lock.held]
    if not held:
        return None
    last = held[-1] / LAST
    if not last.is_file():
        return (f"no checkpoint was saved in {held[-1]} yet: rerunning the same command starts "
                "training from the beginning")
    state = read_metadata(last)
    update = f" (update {num_updates(state)})" if state is not None else ""
    return (f"the last checkpoint saved is {last}{update}, intact: rerun the same command to "
            "resume from it")


# ---------------------------------------------------------------------------------------------
# What to resume from


def plan_resume(cfg, trainer) -> dict:
    """Rank 0's decision for ``load_checkpoint``: ``{"finished": line}``, ``{"error": line}``,
    or ``{"restore": path or None}`` (None: fairseq's own choice)."""
    suffix = trainer.checkpoint_suffix
    save_dir = Path(cfg.save_dir)
    default = cfg.restore_file == LAST
    path = save_dir / last_checkpoint(suffix) if default else Path(cfg.restore_file)
    if default and (cfg.finetune_from_model or getattr(cfg, "continue_once", None)) \
            and not path.exists():
        return {"restore": None}  # fairseq starts from the pretrained model
    restore = None
    if path.is_file():
        try:
            problem = verified_problem(path)
        except OSError as error:
            return {"error": str(file_error(path, error, expected="a checkpoint file"))}
        state = read_metadata(path) if problem is None else None
        if state is None:
            problem = problem or "cannot be loaded"
            if not default or suffix:
                return {"error": f"{path}: not a usable checkpoint ({problem})"}
            logger.warning(f"{path} is not usable: {problem}")
            found = newest_intact(save_dir, path)
            if found is None:
                return {"error": f"{path}: not a usable checkpoint ({problem}) and no other "
                                 f"checkpoint in {save_dir} is intact: move the damaged files "
                                 "away to start over"}
            restore, state = found
            logger.warning(f"resuming from the newest intact checkpoint instead: {restore} "
                           f"(update {num_updates(state)})")
    elif default and not suffix and save_dir.is_dir():
        found = newest_intact(save_dir, path)
        if found is None:
            return {"restore": None}
        restore, state = found
        logger.warning(f"{path} is missing; resuming from the newest intact checkpoint: "
                       f"{restore} (update {num_updates(state)})")
    else:
        return {"restore": None}
    source = restore or path
    finished = finished_reason(state, source, cfg, trainer.cfg.optimization)
    if finished is not None:
        return {"finished": f"training already finished: {finished}; nothing was loaded or "
                            "written (to train again, use another --save-dir)"}
    note = unchecked_note([(source, stored_fingerprint(state))])
    if note is not None:
        logger.warning(note)
    mismatch = architecture_change(state, source, trainer.cfg.model)
    if mismatch is not None:
        return {"error": f"cannot resume: {mismatch}; give the options it was trained with, or "
                         "train into another --save-dir"}
    # shapes of the parameters both have (fairseq's load may still rename old checkpoints'
    # keys, and reports any other difference itself)
    saved = state.get("model") or {}
    model = {key: value for key, value in trainer.get_model().state_dict().items()
             if key in saved}
    mismatch = state_dict_mismatch(model, {key: saved[key] for key in model},
                                   "the model being trained", "the checkpoint")
    if mismatch is not None:
        return {"error": f"{source}: cannot resume: {mismatch}; train into another --save-dir"}
    mismatch = training_data_mismatch(state, source, trainer.task)
    if mismatch is not None:
        return {"error": f"cannot resume: {mismatch}; train into another --save-dir"}
    for line in settings_changes(state, source, trainer.cfg):
        logger.warning(line)
    return {"restore": None if restore is None else str(restore)}


# ---------------------------------------------------------------------------------------------
# The wrappers


def _is_global_master(trainer) -> bool:
    from fairseq.distributed import utils as distributed_utils

    return distributed_utils.is_master(trainer.cfg.distributed_training)


def guarded_load_checkpoint(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def load(cfg, trainer, **passthrough_args):
        from fairseq.distributed import utils as distributed_utils

        global _run_fingerprint
        _run_fingerprint = task_fingerprint(trainer.task)
        if _is_global_master(trainer):
            claim_save_dir(cfg.save_dir)
        plan = plan_resume(cfg, trainer) if trainer.data_parallel_rank == 0 else None
        if trainer.data_parallel_world_size > 1:
            plan = distributed_utils.broadcast_object(
                plan, src_rank=0, group=trainer.data_parallel_process_group,
                dist_device=trainer.device)
        if "finished" in plan:
            logger.info(plan["finished"])
            raise SystemExit(0)
        if "error" in plan:
            raise UserError(plan["error"])
        if plan["restore"] is not None:
            cfg = copy.deepcopy(cfg)
            from omegaconf import open_dict

            with open_dict(cfg):
                cfg.restore_file = plan["restore"]
        return load_checkpoint(cfg, trainer, **passthrough_args)

    return load


def locking_train_main(main):
    """``fairseq_cli.train.main`` that first takes the save directory's lock (process of global
    rank 0), before anything is built or written."""
    from argparse import Namespace

    @functools.wraps(main)
    def train_main(cfg, *args, **kwargs):
        from fairseq.distributed import utils as distributed_utils

        if isinstance(cfg, Namespace):
            from fairseq.dataclass.utils import convert_namespace_to_omegaconf

            cfg = convert_namespace_to_omegaconf(cfg)
        if distributed_utils.is_master(cfg.distributed_training):
            claim_save_dir(cfg.checkpoint.save_dir)
        return main(cfg, *args, **kwargs)

    return train_main


def one_line_torch_persistent_save(torch_persistent_save):
    @functools.wraps(torch_persistent_save)
    def persistent_save(obj, filename, async_write: bool = False):
        from fairseq.file_io import PathManager

        if isinstance(obj, dict) and "model" in obj and _run_fingerprint is not None:
            obj = {**obj, FINGERPRINT_KEY: dict(_run_fingerprint)}

        if async_write or PathManager.path_requires_pathmanager(filename):
            return torch_persistent_save(obj, filename, async_write=async_write)
        try:
            save_checkpoint(obj, filename, verify=False, training_save=True)
        except UserError as error:
            raise UserError(f"{error}; nothing was written, the checkpoints saved before are "
                            "intact: rerun the same command to resume") from None
        return None

    return persistent_save


def verifying_load_checkpoint_to_cpu(load_checkpoint_to_cpu):
    """``checkpoint_utils.load_checkpoint_to_cpu`` that first checks every record of a local
    file against its CRC-32 (:func:`verified_problem`): a damaged file is one line naming it."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        local = Path(path)
        if local.is_file():
            problem = verified_problem(local)
            if problem is not None:
                raise CheckpointError(local, problem, unreadable=True)
        return load_checkpoint_to_cpu(path, arg_overrides=arg_overrides,
                                      load_on_all_ranks=load_on_all_ranks)

    return load_to_cpu


def one_line_load_checkpoint_to_cpu(load_checkpoint_to_cpu):
    """``checkpoint_utils.load_checkpoint_to_cpu`` whose failures on a local file fairseq cannot
    load (empty, truncated, foreign, of an old or unknown layout) are one line naming the file
    and the cause, instead of a traceback."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        local = Path(path)
        if not local.is_file():  # a remote path, or fairseq's own error for a missing file
            return load_checkpoint_to_cpu(path, arg_overrides=arg_overrides,
                                          load_on_all_ranks=load_on_all_ranks)
        refuse_unusable_file(local, verify=False)
        try:
            return load_checkpoint_to_cpu(path, arg_overrides=arg_overrides,
                                          load_on_all_ranks=load_on_all_ranks)
        except LOAD_ERRORS as error:
            raise load_error(local, error, upgrade=True) from None

    return load_to_cpu


def check_ensemble(filenames, task=None, state=None) -> list:
    """Refuse checkpoints that cannot be used together or with ``task``'s dictionaries: their
    training fingerprints must agree with each other (direction, dictionaries and architecture
    options), and each language's dictionary must have the token order the checkpoint was
    trained with. One note line names the checkpoints whose fingerprint lacks a part. Returns
    ``filenames`` without the checkpoints holding the same parameters as an earlier one (a copy
    counts once; one note line names them)."""
    named = []
    state_given = state
    for filename in filenames:
        found = state
        if found is None and Path(filename).is_file():
            found = read_metadata(Path(filename))
        if found is not None:
            named.append((filename, stored_fingerprint(found), found))
    note = unchecked_note([(filename, found) for filename, found, _ in named])
    if note is not None:
        logger.warning(note)
    mismatch = ensemble_mismatch([(filename, found) for filename, found, _ in named])
    if mismatch is not None:
        raise UserError(mismatch)
    expected = task_fingerprint(task) if task is not None else None
    if expected is not None:
        data = getattr(task.cfg, "data", None) or "the task"
        for filename, found, state in named:
            # fairseq's commands: a table of another size would end in the load's traceback,
            # and the direction is whatever the task names; the hub (which passes the state it
            # read) names the parameter and its shapes, and warned when it chose the pair
            problem = vocabulary_size_problem(state, task)
            if problem is not None and state_given is None:
                raise UserError(f"cannot use {filename} with the dictionaries of {data}: "
                                f"{problem}")
            if problem is not None or found is None:
                continue
            if state_given is None and has_data(found) and \
                    (found["source_lang"], found["target_lang"]) != \
                    (expected["source_lang"], expected["target_lang"]):
                logger.warning(f"{filename} was trained {found['source_lang']}->"
                               f"{found['target_lang']}; this run's task is "
                               f"{expected['source_lang']}->{expected['target_lang']}")
            mismatch = dictionary_mismatch(expected, found, f"the data of {data}", filename)
            if mismatch is not None:
                raise UserError(f"cannot use {filename} with the dictionaries of {data}: "
                                f"{mismatch}")
    if len(filenames) < 2 or len(named) != len(filenames) or \
            any(not isinstance(state.get("model"), dict) for _, _, state in named):
        return list(filenames)
    kept, dropped = distinct_parameters(
        [(filename, parameters_sha256(state["model"])) for filename, _, state in named])
    if dropped:
        logger.warning(duplicate_note(dropped, len(kept)))
    return [filenames[index] for index in kept]


def checking_load_model_ensemble_and_task(load_model_ensemble_and_task):
    @functools.wraps(load_model_ensemble_and_task)
    def load(filenames, arg_overrides=None, task=None, *args, **kwargs):
        filenames = check_ensemble(filenames, task, kwargs.get("state"))
        return load_model_ensemble_and_task(filenames, arg_overrides, task, *args, **kwargs)

    return load
