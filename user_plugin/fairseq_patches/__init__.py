"""Every change the plugin makes to fairseq (and to the process) when it loads: one table, and
the code of every replacement it installs.

Loading ``--user-dir user_plugin`` replaces a few attributes of fairseq's modules and classes
(and ``sys.excepthook``), in the whole process: they fix fairseq 0.12 bugs met on this stack or
add what a training run needs (atomic checkpoint copies, verified resumes, progress lines).
Each row of :data:`PATCHES` names one patch: the attributes it replaces, the replacement (by an
ordinary import, so the import graph shows what each row depends on), what it fixes or adds
with the failure observed without it, and the fairseq versions it was checked against. The
replacements live in this package, one module per subject: :mod:`.save_directory` (the
training run's save directory and the checkpoints fairseq reads), :mod:`.checkpoint_copy`,
:mod:`.precision`, :mod:`.optimizer_state`, :mod:`.progress`, :mod:`.decoding`,
:mod:`.one_line_errors`. Nothing outside this package replaces an attribute of fairseq.
``python -m user_plugin.fairseq_patches`` lists the rows.

**Turning them off.** The environment variable ``VASWANI_FAIRSEQ_PATCHES`` (read by
:func:`install`):

* unset, empty or ``on``: every patch;
* ``off``: none (fairseq's own functions throughout; the plugin's model, criterion, scheduler
  and task still register);
* ``off:NAME,NAME``: every patch but those named.

An unknown name is one error line listing the known ones. :func:`uninstall` puts fairseq's
original objects back (the very same objects: identity, not copies).

**Another fairseq version.** The wrappers follow the signatures of the versions in each row's
``checked`` column. On any other version :func:`install` logs one warning line naming the
patches not checked against it, then **applies them**: they pass every argument through and
the plugin's own guarantees (atomic, verified checkpoints; one-line errors) depend on them. A
patch whose target attribute no longer exists is skipped and named in that line.
``VASWANI_FAIRSEQ_PATCHES=off`` is the way out when one misbehaves.

Not in the table, because nothing is replaced: the types of fairseq checkpoints are
allow-listed for torch's safe loading (:mod:`user_plugin.safe_loading`), and the plugin's
registrations go into fairseq's registries.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import (
    checkpoint_copy,
    decoding,
    one_line_errors,
    optimizer_state,
    precision,
    progress,
    save_directory,
    scope,
)
from .scope import EVERY_RUN, OUR_RUNS

logger = logging.getLogger(__name__)

ENV_VAR = "VASWANI_FAIRSEQ_PATCHES"
#: The row of the one-line exception hook, which the commands install alone.
ONE_LINE_ERRORS = "one_line_errors"

#: The fairseq versions every patch below was checked against (``fairseq.__version__``; the
#: ``fairseq-fixed`` 0.12.3.1 distribution reports 0.12.3.1).
FAIRSEQ_0_12 = ("0.12.3.1",)


@dataclass(frozen=True)
class Replacement:
    """One attribute a patch replaces.

    ``target`` is ``"module:attribute.path"`` of fairseq's attribute
    (``"fairseq.trainer:Trainer.train_step"``: a name, since a fairseq version may lack it).
    ``new`` is the replacement; with ``wraps`` it is called with fairseq's original and returns
    the replacement, otherwise it is the replacement itself.
    ``ours``: for a row scoped to our runs, how a call tells whose run it belongs to (one of
    :mod:`.scope`'s functions, called with the call's arguments): the replacement runs when it
    answers True, fairseq's original otherwise.
    ``where_loaded``: the target's module is never imported for the patch, only patched where
    it already runs (a ``fairseq_cli`` command's own module, which ``python -m`` runs as
    ``__main__``, loads the plugin from its ``main``); elsewhere the patch has nothing to
    replace. ``fairseq_cli`` modules configure logging to standard output when imported.
    """

    target: str
    new: Callable[..., Any]
    ours: Optional[Callable[..., bool]] = None
    wraps: bool = True
    where_loaded: bool = False

    @property
    def dotted(self) -> str:
        """The target as ``module.attribute`` (``fairseq.trainer.Trainer.train_step``)."""
        return self.target.replace(":", ".")

    @property
    def replacement(self) -> str:
        """Where the replacement is defined (``module.name``)."""
        return f"{self.new.__module__}.{self.new.__qualname__}"

    @property
    def decided_by(self) -> Optional[str]:
        """What tells a call of one of our runs from another run's, in words; None for a row
        of every run."""
        return None if self.ours is None else getattr(self.ours, "told_by", self.ours.__name__)


@dataclass(frozen=True)
class Patch:
    """One row of the table: a name, what it replaces, what it fixes or adds (with the failure
    observed without it), the runs it applies to (:data:`~.scope.OUR_RUNS` or
    :data:`~.scope.EVERY_RUN`) and the fairseq versions it was checked against."""

    name: str
    replaces: Tuple[Replacement, ...]
    fixes: str
    scope: str
    checked: Tuple[str, ...] = FAIRSEQ_0_12

    def __post_init__(self) -> None:
        if self.scope not in (OUR_RUNS, EVERY_RUN):
            raise ValueError(f"patch {self.name}: scope must be {OUR_RUNS!r} or {EVERY_RUN!r}")
        if any((r.ours is None) == (self.scope == OUR_RUNS) for r in self.replaces):
            raise ValueError(f"patch {self.name}: a row of {OUR_RUNS} says, for each attribute, "
                             "how a call tells whose run it is (and only such a row)")


def _one(target: str, new: Callable[..., Any], ours: Optional[Callable[..., bool]] = None,
         wraps: bool = True, where_loaded: bool = False) -> Tuple[Replacement, ...]:
    return (Replacement(target, new, ours, wraps, where_loaded),)


_CHECKPOINTS = "fairseq.checkpoint_utils"
_TRAINER = "fairseq.trainer:Trainer"

PATCHES: Tuple[Patch, ...] = (
    Patch(
        "atomic_checkpoint_copy",
        _one(f"{_CHECKPOINTS}:save_checkpoint", checkpoint_copy.saving_with_atomic_copies,
             scope.trainer_argument),
        "checkpoint_last.pt / checkpoint_best.pt are copied atomically; fairseq's plain copy "
        "killed mid-way left a truncated checkpoint_last.pt that the next run failed to resume "
        "from (docs/faults.md)",
        OUR_RUNS,
    ),
    Patch(
        "save_dir_lock",
        _one("fairseq_cli.train:main", save_directory.locking_train_main, scope.configuration,
             where_loaded=True),
        "one writer per --save-dir: a second fairseq-train on a directory a live run uses stops "
        "with one line naming the holder, before writing anything (fairseq alone has no lock)",
        OUR_RUNS,
    ),
    Patch(
        "resume_plan",
        _one(f"{_CHECKPOINTS}:load_checkpoint", save_directory.guarded_load_checkpoint,
             scope.trainer_argument),
        "a rerun of a finished run changes nothing (fairseq alone trains update max+1 and "
        "overwrites checkpoint_last.pt); a damaged checkpoint_last.pt resumes from the newest "
        "intact checkpoint (fairseq alone resumes from garbage); partial files of killed saves "
        "are removed; the lock is taken here too where the command did not take it (a spawned "
        "rank 0) (docs/faults.md)",
        OUR_RUNS,
    ),
    Patch(
        "one_line_checkpoint_save",
        _one(f"{_CHECKPOINTS}:torch_persistent_save",
             save_directory.one_line_torch_persistent_save, scope.saved_state),
        "checkpoints are written atomically, hold the run's training fingerprint, and a full "
        "disk is one error line (fairseq alone: a 25-line RuntimeError from torch's zip writer, "
        "and a .tmp file left)",
        OUR_RUNS,
    ),
    Patch(
        "verified_checkpoint_load",
        _one(f"{_CHECKPOINTS}:load_checkpoint_to_cpu",
             save_directory.verifying_load_checkpoint_to_cpu, scope.checkpoint_file),
        "every checkpoint of ours that fairseq reads is CRC-checked first: a damaged file is one "
        "line naming it (fairseq alone: a flipped bit loaded unnoticed, or a torch.load "
        "traceback)",
        OUR_RUNS,
    ),
    Patch(
        "one_line_checkpoint_load",
        _one(f"{_CHECKPOINTS}:load_checkpoint_to_cpu",
             save_directory.one_line_load_checkpoint_to_cpu),
        "a checkpoint fairseq cannot load (empty, truncated, foreign, an unknown layout) is one "
        "line naming it and the cause (fairseq alone: a torch.load traceback)",
        EVERY_RUN,
    ),
    Patch(
        "ensemble_fingerprints",
        _one(f"{_CHECKPOINTS}:load_model_ensemble_and_task",
             save_directory.checking_load_model_ensemble_and_task, scope.ensemble),
        "checkpoints used together (fairseq-generate --path a:b, the hub, the export) must have "
        "been trained on the same data, and on the data dictionaries given, with the same "
        "architecture options: one line naming both fingerprints or the options (fairseq alone: "
        "checkpoints trained on a reordered dictionary of the same size, or with 4 and 8 heads, "
        "ensemble into garbage without a word); a copy of a checkpoint is used once",
        OUR_RUNS,
    ),
    Patch(
        "our_model_searches",
        _one("fairseq.tasks.fairseq_task:FairseqTask.build_generator",
             decoding.building_fixed_searches, scope.stock_generator_of_our_model),
        "our model decoded under fairseq's own --task translation gets the fixed searches of our "
        "task's generator, with fairseq's penalty and length limit (fairseq alone: "
        "--diverse-beam-groups 2 ends in IndexError, constraints and short-beam alignments "
        "fail); a stock model keeps fairseq's generator",
        OUR_RUNS,
    ),
    Patch(
        "batch_limits",
        _one("fairseq.data.data_utils:batch_by_size", one_line_errors.checked_batch_by_size),
        "a batch limit below 1 (--max-tokens 0, --batch-size 0, and their -valid forms) is one "
        "line naming it (fairseq alone: IndexError in batch_by_size, or a batch with no "
        "sentence)",
        EVERY_RUN,
    ),
    Patch(
        ONE_LINE_ERRORS,
        _one("sys:excepthook", one_line_errors.one_line_excepthook),
        "the plugin's UserError reaching fairseq's entry points prints 'prog: error: ...' and "
        "exits 1, instead of a traceback, and so do fairseq's errors on bad input that "
        "one_line_errors recognises (--max-tokens below a sentence, a missing dictionary, a "
        "checkpoint of another layout, fairseq-interactive input that is not UTF-8); Ctrl-C "
        "prints one line saying what was left (a training run's last checkpoint) and ends by "
        "SIGINT; any other exception keeps its traceback",
        EVERY_RUN,
    ),
    Patch(
        "mixed_precision",
        (
            Replacement(f"{_TRAINER}.__init__", precision.trainer_init_mixed_precision,
                        scope.trainer_construction),
            Replacement(f"{_TRAINER}._build_optimizer",
                        precision.trainer_build_optimizer_mixed_precision, scope.trainer_call),
            Replacement(f"{_TRAINER}._fp_convert_sample",
                        precision.trainer_fp_convert_sample_bf16, scope.trainer_call),
            Replacement(f"{_TRAINER}.state_dict", precision.trainer_state_dict_float32_masters,
                        scope.trainer_call),
            Replacement(f"{_TRAINER}.train_step", precision.trainer_train_step_mixed_precision,
                        scope.trainer_call),
        ),
        "--fp16 / --bf16 keep float32 masters in one flat tensor moved by multi-tensor copies "
        "(fairseq's FP16Optimizer: ~3,000 per-tensor operator calls per update, CUDA only, "
        "rounded masters in checkpoints) and save them as the model's weights; --bf16 --amp is "
        "bfloat16 autocast over float32 weights",
        OUR_RUNS,
    ),
    Patch(
        "bf16_without_tpu",
        (
            Replacement("fairseq.distributed.utils:call_main",
                        precision.call_main_bf16_without_tpu),
            Replacement(f"{_TRAINER}.__init__", precision.trainer_init_bf16_without_tpu),
        ),
        "--bf16 without torch_xla: fairseq turns --tpu on with it and died with \"'NoneType' "
        "object has no attribute 'xla_device'\" (on CPU and CUDA); --tpu is turned off again, "
        "which only turns the crash into fairseq's own non-TPU path",
        EVERY_RUN,
    ),
    Patch(
        "fp16_without_cuda",
        _one(f"{_TRAINER}.__init__", precision.trainer_init_refusing_fp16_without_cuda),
        "--fp16 on fairseq's own optimizer path without CUDA is one error line naming what "
        "works there, before anything is built (fairseq alone fails at the first update with "
        "a 147-line 'AssertionError: Torch not compiled with CUDA enabled')",
        EVERY_RUN,
    ),
    Patch(
        "optimizer_state_layouts",
        _one(f"{_TRAINER}.load_checkpoint",
             optimizer_state.trainer_load_checkpoint_converting_layouts, scope.trainer_call),
        "a checkpoint whose optimizer state another precision mode wrote (per tensor: the plain "
        "optimizer, --bf16 --amp, --memory-efficient-fp16; flat: FP16Optimizer, "
        "Float32MasterOptimizer) resumes with its state converted, one log line (fairseq alone: "
        "'AssertionError: Optimizer does not match; please reset the optimizer "
        "(--reset-optimizer). FairseqAdam vs Float32MasterOptimizer'); what cannot be converted "
        "is one error line",
        OUR_RUNS,
    ),
    Patch(
        "fp16_overflow_on_cpu",
        _one(f"{_TRAINER}.train_step", precision.trainer_train_step_fp16_on_cpu),
        "--fp16 / --memory-efficient-fp16 --cpu survive a loss-scale overflow (fairseq's trainer "
        "calls torch.tensor(0.0).cuda(), which fails without CUDA); torch.Tensor.cuda is "
        "replaced only inside that CPU float16 step's with-block, which restores it",
        EVERY_RUN,
    ),
    Patch(
        "progress_report",
        _one("fairseq_cli.train:train", progress.training_with_progress, scope.trainer_argument,
             where_loaded=True),
        "adds a line with update N/max, elapsed and time left after each train_inner record "
        "(fairseq never says how far a run is)",
        OUR_RUNS,
    ),
    Patch(
        "replace_unk_flag",
        _one("fairseq.utils:load_align_dict", decoding.loading_no_align_dict_for_the_flag),
        "--replace-unk without a file opened the flag's constant: \"FileNotFoundError: '@@ '\"",
        EVERY_RUN,
    ),
    Patch(
        "replace_unk_alignments",
        _one("fairseq.utils:replace_unk", decoding.replace_unk, wraps=False),
        "--replace-unk read --print-alignment's (source, target) pairs as positions: 'TypeError: "
        "list indices must be integers or slices, not tuple'",
        EVERY_RUN,
    ),
    Patch(
        "interactive_empty_source",
        _one("fairseq_cli.interactive:main", decoding.interactive_keeping_empty_sources,
             scope.configuration, where_loaded=True),
        "fairseq-interactive --constraints stripped the tab of a line '<TAB>Hund' (an empty "
        "source), so the constraint became the source and no constraint applied; the leading "
        "tab is kept, and the paper's task refuses an empty source with constraints",
        OUR_RUNS,
    ),
)

#: name -> patch
BY_NAME: Dict[str, Patch] = {patch.name: patch for patch in PATCHES}


class PatchSwitchError(ValueError):
    """``VASWANI_FAIRSEQ_PATCHES`` names a patch that does not exist, or is malformed."""


def disabled_by_environment(value: Optional[str] = None) -> Tuple[str, ...]:
    """The names of the patches that ``VASWANI_FAIRSEQ_PATCHES`` (or ``value``) turns off."""
    text = (os.environ.get(ENV_VAR, "") if value is None else value).strip()
    if text in ("", "on"):
        return ()
    if text == "off":
        return tuple(BY_NAME)
    if not text.startswith("off:"):
        raise PatchSwitchError(
            f"{ENV_VAR}={text!r}: expected 'on', 'off' or 'off:NAME,NAME'")
    names = tuple(name.strip() for name in text[len("off:"):].split(",") if name.strip())
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise PatchSwitchError(
            f"{ENV_VAR}: no patch named {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return names


def fairseq_version() -> str:
    import fairseq

    return str(getattr(fairseq, "__version__", "unknown"))


def _loaded_module(name: str) -> Any:
    """The module ``name`` where it is loaded: imported under its name, or run by ``python -m``
    as ``__main__``; None when neither."""
    if name in sys.modules:
        return sys.modules[name]
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return main if spec is not None and spec.name == name else None


def _owner_and_attribute(target: str, where_loaded: bool = False) -> Tuple[Any, str]:
    """The object holding ``target``'s attribute, and the attribute's name; with
    ``where_loaded`` the owner is None when the target's module is not loaded."""
    module_name, _, path = target.partition(":")
    owner: Any = _loaded_module(module_name) if where_loaded \
        else importlib.import_module(module_name)
    if owner is None:
        return None, path.split(".")[-1]
    *parents, attribute = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, attribute


def target_exists(replacement: Replacement) -> bool:
    """Whether fairseq (this version) has the attribute ``replacement`` replaces."""
    if replacement.where_loaded:
        module = replacement.target.partition(":")[0]
        return importlib.util.find_spec(module.split(".")[0]) is not None
    try:
        owner, attribute = _owner_and_attribute(replacement.target)
    except (ImportError, AttributeError):
        return False
    return hasattr(owner, attribute)


# patch name -> (owner, attribute name, the original, whether the owner held it itself) for
# each attribute the patch replaced
_INSTALLED: Dict[str, List[Tuple[Any, str, Any, bool]]] = {}


def installed() -> Tuple[str, ...]:
    """The names of the patches installed in this process, in the table's order."""
    return tuple(name for name in BY_NAME if name in _INSTALLED)


def _for_our_runs(original: Callable[..., Any], new: Callable[..., Any],
                  ours: Callable[..., bool]) -> Callable[..., Any]:
    """What goes in place of fairseq's ``original`` for a row scoped to our runs: ``new`` for a
    call that ``ours`` (given the call's arguments) says belongs to one of our runs, fairseq's
    ``original`` for any other."""

    @functools.wraps(original)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if ours(*args, **kwargs):
            return new(*args, **kwargs)
        return original(*args, **kwargs)

    dispatch.vaswani_replacement = new  # type: ignore[attr-defined]
    return dispatch


def _install_patch(patch: Patch) -> None:
    done: List[Tuple[Any, str, Any, bool]] = []
    for replacement in patch.replaces:
        owner, attribute = _owner_and_attribute(replacement.target, replacement.where_loaded)
        if owner is None or not hasattr(owner, attribute):
            continue  # a command module not running in this process: nothing to replace
        # a class may inherit the attribute: then removing ours restores the inherited one
        own = not isinstance(owner, type) or attribute in vars(owner)
        original = vars(owner)[attribute] if isinstance(owner, type) and own \
            else getattr(owner, attribute)
        new = replacement.new(original) if replacement.wraps else replacement.new
        if replacement.ours is not None:
            new = _for_our_runs(original, new, replacement.ours)
        setattr(owner, attribute, new)
        done.append((owner, attribute, original, own))
    _INSTALLED[patch.name] = done


def install(only: Optional[Callable[[Patch], bool]] = None) -> Tuple[str, ...]:
    """Install every patch of :data:`PATCHES` that ``VASWANI_FAIRSEQ_PATCHES`` leaves on (and
    ``only`` accepts), once: a patch already installed is left as it is. Returns the names
    installed by this call.

    On a fairseq version outside a patch's ``checked`` versions, one warning line names those
    patches; they are applied all the same (see the module's description), except those whose
    target fairseq no longer has.
    """
    off = set(disabled_by_environment())
    wanted = [patch for patch in PATCHES
              if patch.name not in off and patch.name not in _INSTALLED
              and (only is None or only(patch))]
    if not wanted:
        return ()
    # fairseq's version matters to rows that replace its attributes only (and importing it
    # takes seconds: a command installing the exception hook alone never pays for it)
    of_fairseq = [patch for patch in wanted if any(
        replacement.target.split(".")[0].split(":")[0] in ("fairseq", "fairseq_cli")
        for replacement in patch.replaces)]
    version = fairseq_version() if of_fairseq else None
    unchecked = [patch for patch in of_fairseq if version not in patch.checked]
    missing = [patch for patch in unchecked
               if not all(target_exists(r) for r in patch.replaces)]
    if unchecked:
        checked = sorted({v for patch in unchecked for v in patch.checked})
        skipped = f"; skipped, target missing: {', '.join(p.name for p in missing)}" \
            if missing else ""
        logger.warning(
            "fairseq %s is not a version the plugin's fairseq patches were checked against "
            "(%s); applying them anyway: %s%s (turn off: %s=off or off:NAME,...)",
            version, ", ".join(checked),
            ", ".join(p.name for p in unchecked if p not in missing), skipped, ENV_VAR,
        )
    done = []
    for patch in wanted:
        if patch in missing:
            continue
        _install_patch(patch)
        done.append(patch.name)
    return tuple(done)


def uninstall(names: Optional[Tuple[str, ...]] = None) -> Tuple[str, ...]:
    """Put fairseq's original objects back for the installed patches ``names`` (all by
    default), in reverse order of installation. Returns the names removed."""
    removed = []
    for name in reversed(list(_INSTALLED)):
        if names is not None and name not in names:
            continue
        for owner, attribute, original, own in reversed(_INSTALLED.pop(name)):
            if own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)
        removed.append(name)
    return tuple(reversed(removed))


def describe() -> List[Dict[str, Any]]:
    """One record per patch: its name, targets and replacements, what it fixes, the runs it
    applies to (``scope``) and what tells them apart (``decided_by``), checked versions, and its
    state in this process (``installed``), under the environment (``on``) and for this fairseq
    (``version_checked``)."""
    off = set(disabled_by_environment())
    version = fairseq_version()
    return [
        {
            "name": patch.name,
            "targets": [r.dotted for r in patch.replaces],
            "replacements": [r.replacement for r in patch.replaces],
            "scope": patch.scope,
            "decided_by": [r.decided_by for r in patch.replaces if r.decided_by],
            "fixes": patch.fixes,
            "checked": list(patch.checked),
            "on": patch.name not in off,
            "installed": patch.name in _INSTALLED,
            "version_checked": version in patch.checked,
        }
        for patch in PATCHES
    ]
