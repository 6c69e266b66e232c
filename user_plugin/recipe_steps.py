"""The step engine of the shell recipes: what a step records about its work, how its inputs are
identified, and what a rerun does with the work it finds (skip, redo, resume, continue, start
over or refuse). ``vaswani-step`` (:mod:`user_plugin.commands.recipe_step`) serves it to
``recipes/common.sh``.

A step writes its outputs into its own directory. Once all of them are there it writes the
record ``<dir>/.done``; a step that keeps partial work (training) also writes ``<dir>/.started``
before it starts. Both are text, one fact a line:

* ``id <run id>``: this run of the step, what later steps record as its identity: in
  ``.done``, a fingerprint of its outputs (:func:`outputs_id`: a step redone into the same
  bytes is the same input for the steps after it); in ``.started``, or for a step that
  lists no outputs, the time, process id and random digits;
* ``config <sha256>``: the fingerprint of the settings text the step ran with, and
  ``settings <text>``: that text (line breaks escaped), so that a refusal can name what changed;
* ``continues <run id>`` (``.started`` only): the finished run this work extends;
* ``upstream <path> <identity>``: an input it read, in order (the identity is the last field;
  the path may hold spaces): the id of the upstream step's run, ``content-<hash>`` for a
  directory made outside the recipes (names, sizes and the sha256 of each file up to 16 MiB
  directly in it), ``sha256-<hex>`` for a file;
* ``output <size> <path>``: each output, relative to the directory, with its size.

A step is done when ``.done`` exists (and no ``.started`` continues it), its settings are the
same, every upstream input has the identity recorded (so a directory of finished steps can be
moved or copied and stays finished, while an input redone or edited in place is noticed) and
every output has its recorded size. Otherwise it is redone from scratch: its directory is
emptied first, unless a live training run holds it (the lock of
:mod:`user_plugin.fairseq_patches.save_directory`).

Training is the exception, because its work is costly (:func:`begin_training`). A finished or
interrupted run is continued when only its growing setting (``max_update``) is raised; a
changed input starts it over; any other change (settings, a lowered goal, a lost checkpoint)
is refused in one line unless the caller asks to start over, since starting over deletes the
checkpoints.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .artifacts.digests import sha256_of
from .files.atomic import atomic_write
from .files.checkpoint_names import looks_like_checkpoint
from .files.errors import UserError, file_error
from .files.training_state import TRAINING_LOCK

DONE = ".done"
STARTED = ".started"
#: Files up to this size are hashed by :func:`content_id`; larger ones count by size.
CONTENT_HASH_LIMIT = 16 * 1024 * 1024
#: The setting whose growth extends a finished training run (its number of updates).
GROWING_SETTING = "max_update"

_HEADERS = {
    DONE: "# written when the step finished; delete this file to redo the step",
    STARTED: "# written when the step started: its partial work is continued with these only",
}


class StepRefused(UserError):
    """A step will not run as asked, for a reason the user can act on (one line)."""


@dataclass
class Record:
    """A step's record (``.done`` or ``.started``), as the module docstring describes it."""

    id: str = ""
    config: str = ""
    settings: str | None = None
    continues: str | None = None
    upstreams: list[tuple[str, str]] = field(default_factory=list)
    outputs: list[tuple[int, str]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Records


def config_hash(config: str) -> str:
    """The fingerprint recorded for a step's settings text: its sha256 (hex)."""
    return hashlib.sha256(config.encode("utf-8", "surrogateescape")).hexdigest()


def new_run_id() -> str:
    """A new, unique id for a run of a step: local time, process id, random digits."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.randbelow(10**8):08d}"


def outputs_id(directory: Path, outputs: Sequence[str]) -> str:
    """The id of a finished run: a fingerprint of its outputs (each name, size and whole-file
    sha256), so that a step redone into the same bytes keeps its identity and the steps
    downstream of it stay finished, while any other output is a new input for them."""
    listing = hashlib.sha256()
    for name in outputs:
        path = directory / name
        listing.update(f"{name}\0{path.stat().st_size}\0{sha256_of(path)}\n".encode(
            "utf-8", "surrogateescape"))
    return "outputs-" + listing.hexdigest()[:32]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def read_record(path: Path) -> Record | None:
    """The record in file ``path``, or None when there is none. Lines it does not know (a
    comment, a later format's) are skipped; an unreadable file is a one-line error."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise file_error(path, error) from None
    record = Record()
    for line in text.split("\n"):
        kind, _, rest = line.partition(" ")
        if kind == "id" and not record.id:
            record.id = rest.split(" ")[0]
        elif kind == "config" and not record.config:
            record.config = rest.split(" ")[0]
        elif kind == "settings" and record.settings is None:
            record.settings = _unescape(rest)
        elif kind == "continues":
            record.continues = rest
        elif kind == "upstream":
            upstream, _, identity = rest.rpartition(" ")
            record.upstreams.append((upstream, identity))
        elif kind == "output":
            size, _, name = rest.partition(" ")
            if size.isdigit() and name:
                record.outputs.append((int(size), name))
    if record.settings is not None and config_hash(record.settings) != record.config:
        record.settings = None  # edited by hand: the fingerprint alone is trusted
    return record


def write_record(directory: Path, kind: str, config: str, upstreams: Sequence[str],
                 outputs: Sequence[str] = (), continues: str | None = None) -> Record:
    """Write ``directory/kind`` (:data:`DONE` or :data:`STARTED`) atomically: a new run id,
    the settings, the identities the upstream inputs have now and, for a finished step, the
    outputs (paths relative to ``directory``; each must exist) with their sizes."""
    for text in (*upstreams, *outputs):
        if "\n" in text:
            raise UserError(f"{text!r}: a path of a step must not hold a line break")
    record = Record(id=new_run_id(), config=config_hash(config), settings=config,
                    continues=continues,
                    upstreams=[(path, input_id(path)) for path in upstreams])
    for name in outputs:
        path = directory / name
        if not path.is_file():
            raise UserError(f"step output {path} was not written")
        record.outputs.append((path.stat().st_size, name))
    if kind == DONE and outputs:
        record.id = outputs_id(directory, outputs)
    lines = [_HEADERS[kind], f"id {record.id}", f"config {record.config}",
             f"settings {_escape(config)}"]
    if continues:
        lines.append(f"continues {continues}")
    lines += [f"upstream {path} {identity}" for path, identity in record.upstreams]
    lines += [f"output {size} {name}" for size, name in record.outputs]

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write("\n".join(lines) + "\n")

    atomic_write(directory / kind, write)
    return record


def finished_record(directory: Path) -> Record | None:
    """The ``.done`` record of ``directory``, unless there is none or a ``.started`` record
    continues it (the finished run is being extended)."""
    done = read_record(directory / DONE)
    if done is None:
        return None
    started = read_record(directory / STARTED)
    if started is not None and started.continues and started.continues == done.id:
        return None
    return done


# ---------------------------------------------------------------------------------------------
# Identities of inputs


def content_id(directory: Path) -> str:
    """A fingerprint of the files directly in ``directory`` (hidden ones aside): their names,
    sizes and the sha256 of each file up to :data:`CONTENT_HASH_LIMIT`, in byte order of the
    names; it does not depend on where the directory is."""
    listing = hashlib.sha256()
    for name in sorted(os.listdir(os.fsencode(directory))):
        path = Path(os.fsdecode(os.path.join(os.fsencode(directory), name)))
        if name.startswith(b".") or not path.is_file():
            continue
        size = path.stat().st_size
        line = name + b" " + str(size).encode()
        if size <= CONTENT_HASH_LIMIT:
            line += b" " + sha256_of(path).encode()
        listing.update(line + b"\n")
    return "content-" + listing.hexdigest()[:32]


def input_id(path: str | os.PathLike) -> str:
    """The identity of a step's input: the run id in a directory's ``.done`` record, else a
    directory's :func:`content_id` (made outside the recipes), a file's ``sha256-<hex>``, and
    ``""`` for a path that does not exist."""
    path = Path(path)
    done = read_record(path / DONE) if path.is_dir() else None
    if done is not None:
        return done.id
    if path.is_dir():
        return content_id(path)
    if path.is_file():
        return "sha256-" + sha256_of(path)
    return ""


# ---------------------------------------------------------------------------------------------
# Checks of a record against the step as it is asked for now


def outputs_problem(directory: Path, record: Record) -> str | None:
    """Why the outputs of a finished step are not as recorded (missing, another size), or
    None."""
    for size, name in record.outputs:
        path = directory / name
        if not path.is_file():
            return f"output {path} is missing"
        if path.stat().st_size != size:
            return f"output {path} has changed size"
    return None


def inputs_problem(record: Record, upstreams: Sequence[str]) -> str | None:
    """Why the inputs a record holds are not the identities ``upstreams`` have now, or None."""
    if len(record.upstreams) != len(upstreams):
        return "it now reads other inputs"
    for (_, recorded), upstream in zip(record.upstreams, upstreams):
        if not recorded or recorded != input_id(upstream):
            return f"its input {upstream} was redone or changed"
    return None


def settings_change(old: str, new: str) -> str:
    """The words that differ between two settings texts: ``a=1 -> a=2; (none) -> b=3``."""
    before, after = old.split(), new.split()
    changes = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            changes.append(f"{' '.join(before[i1:i2]) or '(none)'} -> "
                           f"{' '.join(after[j1:j2]) or '(none)'}")
    return "; ".join(changes)


def settings_problem(record: Record, config: str) -> str | None:
    """Why ``config`` is not the settings text a record holds (naming the words that changed
    when the record keeps its text), or None."""
    if record.config == config_hash(config):
        return None
    if record.settings is None:
        return "its settings changed"
    return f"its settings changed ({settings_change(record.settings, config)})"


def grown_setting(record: Record, config: str, name: str) -> tuple[int, int] | None:
    """``(recorded, asked)`` when ``config`` differs from the record's settings text in the
    integer value of ``name=...`` only; None for any other difference (or none)."""
    if record.settings is None:
        return None
    before, after = record.settings.split(), config.split()
    if len(before) != len(after):
        return None
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    if len(changed) != 1:
        return None
    pattern = re.compile(rf"{re.escape(name)}=(\d+)")
    old, new = (pattern.fullmatch(word) for word in changed[0])
    if old is None or new is None:
        return None
    return int(old.group(1)), int(new.group(1))


def done_problem(directory: Path, config: str, upstreams: Sequence[str]) -> str | None:
    """None when the step in ``directory`` is done (see the module docstring) with these
    settings on the current runs of these upstream inputs; otherwise why not (``""`` when it
    has no finished record)."""
    record = finished_record(directory)
    if record is None:
        return ""
    return (outputs_problem(directory, record) or settings_problem(record, config)
            or inputs_problem(record, upstreams))


def require_problem(directory: Path, step: str, inputs: Sequence[str] = ()) -> str | None:
    """Why a later step cannot use the step ``step`` in ``directory``: it has not finished
    (or lost outputs), or, when its ``inputs`` are given, one of them was redone since it ran.
    None when it can."""
    record = finished_record(directory)
    if record is None:
        return f"run the {step} step first (no marker {directory / DONE})"
    problem = outputs_problem(directory, record)
    if problem is not None:
        return f"run the {step} step first ({problem})"
    if inputs:
        problem = inputs_problem(record, inputs)
        if problem is not None:
            return f"run the {step} step again: {problem} since it ran"
    return None


def continue_problem(directory: Path, config: str, upstreams: Sequence[str]) -> str | None:
    """Why the partial work in ``directory`` was not started with these settings on these
    inputs (``.started``), or None when it was and can be continued."""
    record = read_record(directory / STARTED)
    if record is None:
        return f"no record of how the work in {directory} was started"
    problem = settings_problem(record, config) or inputs_problem(record, upstreams)
    if problem is not None:
        return f"the unfinished work in {directory} cannot be continued: {problem}"
    return None


# ---------------------------------------------------------------------------------------------
# Acting on a step's directory


def live_holder(directory: Path) -> str | None:
    """The holder's line when a live training run holds ``directory`` (its lock file,
    :data:`~user_plugin.files.training_state.TRAINING_LOCK`, is locked), else None."""
    try:
        handle = os.open(directory / TRAINING_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        line = os.pread(handle, 4096, 0).decode("utf-8", "replace").strip().split("\n")[0]
        return line or "holder unknown"
    else:
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
    finally:
        os.close(handle)


def step_lock_path(directory: Path) -> Path:
    """The hidden file beside a step's ``directory`` that a recipe working in it holds locked
    (beside it, since a redone step replaces the directory itself); its parent is created."""
    directory = Path(os.path.abspath(directory))
    directory.parent.mkdir(parents=True, exist_ok=True)
    return directory.parent / f".{directory.name}.lock"


def hold(directory: Path, descriptor: int, caller: str, step: str) -> None:
    """Lock the step's lock file, open in the recipe's shell as ``descriptor`` (inherited):
    the lock belongs to that open file, so it lasts until the shell and the processes it
    started have ended, and nothing is left to clean after a kill. The file then names the
    holder: ``caller`` (the recipe started first in the chain, with its process id and start)
    and its ``step``. Raise :class:`StepRefused` naming the holder when another recipe holds
    it; a script of the same chain may hold it again (its steps run one after another)."""
    path = step_lock_path(directory)
    try:
        opened, named = os.fstat(descriptor), os.stat(path)
    except OSError as error:
        raise UserError(f"file descriptor {descriptor} is not open on {path} ({error.strerror})") \
            from None
    if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino):
        raise UserError(f"file descriptor {descriptor} is not open on {path}")
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text(encoding="utf-8", errors="replace").split("\n")
        if holder[0] == caller:
            return
        named = f"{holder[0]}, at its {holder[1]} step" if len(holder) > 2 else "another recipe"
        raise StepRefused(f"{directory} is in use by {named}: wait for it to end, or work in "
                          "another WORK_DIR (RUN_DIR)") from None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{caller}\n{step}\n".encode(), 0)


def refuse_if_in_use(directory: Path) -> None:
    """Raise :class:`StepRefused` when a live training run holds ``directory``."""
    holder = live_holder(directory)
    if holder is not None:
        raise StepRefused(f"{directory} is in use by a training run that is still going on "
                          f"({holder}); wait for it to end")


def restart(directory: Path) -> None:
    """Empty ``directory`` (created if missing) for a step that is redone from scratch; never
    the directory of a training run that is still going on."""
    refuse_if_in_use(directory)
    try:
        if directory.is_symlink() or directory.is_file():
            directory.unlink()
        elif directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise file_error(error.filename or directory, error, writing=True) from None


def begin(directory: Path, config: str, upstreams: Sequence[str],
          continues: str | None = None) -> Record:
    """Record in ``directory/.started`` (the directory is created) the settings and inputs a
    step that keeps partial work starts, or continues, with."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise file_error(directory, error, writing=True) from None
    return write_record(directory, STARTED, config, upstreams, continues=continues)


def mark_done(directory: Path, config: str, upstreams: Sequence[str],
              outputs: Sequence[str]) -> Record:
    """Write ``directory/.done`` once every output exists (at least one); the ``.started``
    record goes."""
    if not outputs:
        raise UserError(f"the step in {directory} names no output")
    record = write_record(directory, DONE, config, upstreams, outputs)
    (directory / STARTED).unlink(missing_ok=True)
    return record


def redo_problem(directory: Path, reason: str, save_dir: Path, start_over: str) -> str | None:
    """Why the data step in ``directory`` must not redo its finished work (``reason``: why it
    would, as :func:`done_problem` says): ``save_dir`` holds checkpoints trained on that data,
    which the training step would then delete when it starts over. None when ``start_over`` is
    ``"1"``, the work never finished, only an output was lost (the same data again), or there
    are no checkpoints."""
    if start_over not in ("0", "1"):
        raise UserError(f"START_OVER must be 0 or 1, got {start_over!r}")
    if (start_over == "1" or not (directory / DONE).is_file() or reason.startswith("output ")
            or not has_checkpoints(save_dir)):
        return None
    return (f"the data in {directory} would be redone ({reason or 'its settings changed'}) "
            f"and the run in {save_dir} would start over, deleting its checkpoints: restore "
            "the setting, choose another WORK_DIR, or set START_OVER=1 to redo the data and "
            "train again")


def has_checkpoints(directory: Path) -> bool:
    """``directory`` holds checkpoints that a fairseq-train run would resume from."""
    try:
        return any(looks_like_checkpoint(name) for name in os.listdir(directory))
    except OSError:
        return False


@dataclass
class TrainingPlan:
    """What :func:`begin_training` does: ``action`` (``fresh``, ``resume``, ``continue``,
    ``start-over``, or ``done``: nothing), the lines that say so (at least one), and the
    finished run that the work continues, if any."""

    action: str
    notes: list[str] = field(default_factory=list)
    continues: str | None = None


def _start_over_or_refuse(problem: str, start_over: bool, directory: Path) -> TrainingPlan:
    if not start_over:
        raise StepRefused(f"{problem}; starting over would delete its checkpoints: set "
                          "START_OVER=1 to do so, or train into another directory (nothing "
                          "was changed)")
    return TrainingPlan("start-over", [problem, f"starting over in {directory} (START_OVER=1)"])


def plan_training(directory: Path, config: str, upstreams: Sequence[str],
                  start_over: bool = False, growing: str = GROWING_SETTING) -> TrainingPlan:
    """Decide what a training step does with the work in ``directory`` (see the module
    docstring); raise :class:`StepRefused` where that would delete checkpoints that the user
    did not ask to delete (``start_over``). The lines name the growing setting as the recipes'
    variable (``max_update`` is ``MAX_UPDATE``)."""
    refuse_if_in_use(directory)
    name = growing.upper()
    done = finished_record(directory)
    if done is not None:
        problem = inputs_problem(done, upstreams)
        if problem is not None:
            return TrainingPlan("start-over", [f"starting over in {directory}: {problem}"])
        grown = grown_setting(done, config, growing)
        if grown is not None and grown[1] > grown[0]:
            return TrainingPlan("continue", [
                f"continuing the finished run in {directory}: {name} grew from {grown[0]} to "
                f"{grown[1]}; its checkpoints are kept and training resumes from its last "
                f"one (update {grown[0]})"], continues=done.id)
        if grown is not None:
            return _start_over_or_refuse(
                f"the run in {directory} finished at {name}={grown[0]}, past the "
                f"{name}={grown[1]} asked for now (set {name}={grown[0]} to use it)",
                start_over, directory)
        problem = settings_problem(done, config) or outputs_problem(directory, done)
        if problem is None:
            return TrainingPlan("done", [f"already done ({directory / DONE})"])
        return _start_over_or_refuse(f"the finished run in {directory} differs: {problem}",
                                     start_over, directory)
    if not has_checkpoints(directory):
        return TrainingPlan("fresh", [f"starting a new run in {directory}"])
    started = read_record(directory / STARTED)
    if started is None:
        return TrainingPlan("start-over", [
            f"starting over in {directory}: its checkpoints have no record of the settings "
            f"and data they were trained with (no {STARTED}; a deleted {DONE} redoes the "
            "step)"])
    resuming = f"resuming in {directory} (from its newest intact checkpoint)"
    cannot = f"the unfinished work in {directory} cannot be continued"
    problem = inputs_problem(started, upstreams)
    if problem is not None:
        return TrainingPlan("start-over", [f"{cannot}: {problem}", f"starting over in {directory}"])
    if started.config == config_hash(config):
        return TrainingPlan("resume", [resuming], continues=started.continues)
    grown = grown_setting(started, config, growing)
    if grown is not None and grown[1] > grown[0]:
        return TrainingPlan("resume", [f"{resuming}, now to {name}={grown[1]} (it was started "
                                       f"for {grown[0]})"], continues=started.continues)
    if grown is not None:
        return _start_over_or_refuse(
            f"{cannot}: it was started for {name}={grown[0]} and may be past the "
            f"{name}={grown[1]} asked for now (set {name}={grown[0]} to continue it)",
            start_over, directory)
    return _start_over_or_refuse(f"{cannot}: {settings_problem(started, config)}",
                                 start_over, directory)


def begin_training(directory: Path, config: str, upstreams: Sequence[str],
                   start_over: bool = False, growing: str = GROWING_SETTING) -> TrainingPlan:
    """Make ``directory`` ready for a fairseq-train run with these settings and inputs, as
    :func:`plan_training` decides, and record them (``.started``). A continued finished run
    keeps its checkpoints; its ``.done`` goes once ``.started`` says what continues it."""
    plan = plan_training(directory, config, upstreams, start_over, growing)
    if plan.action == "done":
        return plan
    if plan.action == "start-over":
        restart(directory)
    begin(directory, config, upstreams, continues=plan.continues)
    if plan.continues:
        (directory / DONE).unlink(missing_ok=True)
    return plan


# ---------------------------------------------------------------------------------------------
# Step directories


def is_within(path: Path, directory: Path) -> bool:
    """``path`` is ``directory`` or lies below it (both absolute and normalised)."""
    return path == directory or directory in path.parents


def overlap_problem(steps: Sequence[tuple[str, Path]],
                    kept: Sequence[tuple[str, Path]]) -> str | None:
    """Why the step directories ``steps`` (name, directory) are not apart: a step empties its
    directory when it is redone, so none may be or hold another step's directory or one of
    ``kept`` (name, directory). None when they are apart."""
    for name, directory in steps:
        for other, other_directory in steps:
            if other != name and is_within(other_directory, directory):
                return (f"the {name} step's directory {directory} holds the {other} step's "
                        f"{other_directory}")
        for what, path in kept:
            if is_within(path, directory):
                return (f"the {name} step's directory {directory} holds {what} ({path}), which "
                        "it would empty when redone")
    return None
