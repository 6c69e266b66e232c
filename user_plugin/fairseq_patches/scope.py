"""Which fairseq runs a row of the patch table applies to.

Loading the plugin (``--user-dir``) installs the table in the whole process. A row that changes
what a run computes or writes (its precision, its checkpoints, its log) applies to **our runs**
only: runs of the plugin's model or task (:func:`is_our_run`). A stock run in the same process,
for example ``--arch transformer --task translation`` loading the plugin only for its scheduler
or criterion, gets fairseq's own function, and behaves as stock fairseq does. A row applies to
**every run** only when it turns a crash of fairseq's into a working result, or into one error
line where fairseq would crash anyway.

A row scoped to our runs names, for each attribute it replaces, how a call tells whose run it
belongs to: one of the functions below, called with the call's own arguments (the trainer, the
configuration, the state being saved, the checkpoint being read). The table's machinery
(:mod:`user_plugin.fairseq_patches`) calls the replacement when it answers True and fairseq's
original otherwise; no replacement repeats that test.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

#: A row's scope: the runs of the plugin's model or task only ...
OUR_RUNS = "our runs"
#: ... or every run (only for rows that turn a crash of fairseq's into a result or one line).
EVERY_RUN = "every run"


def _section(cfg: Any, name: str) -> Any:
    """``cfg.name`` of an omegaconf configuration or a dict, or None (a Namespace has no
    sections)."""
    try:
        return cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)
    except Exception:  # omegaconf's missing-value errors: no such section
        return None


def _selected_name(cfg: Any, section: str, legacy: str) -> Optional[str]:
    """The name chosen for ``section`` ("model", "task"): ``cfg.section._name`` of an omegaconf
    configuration (or of its plain-container copy in a checkpoint), or the Namespace attribute
    ``legacy`` (``arch``, ``task``)."""
    part = _section(cfg, section)
    if part is not None and not isinstance(part, str):
        name = _section(part, "_name")
        if name:
            return str(name)
    value = getattr(cfg, legacy, None)
    return value if isinstance(value, str) else None


def is_our_run(cfg: Any) -> bool:
    """Whether a fairseq configuration (omegaconf, its plain-container copy, or an argparse
    Namespace) trains or runs the plugin's model (any architecture of ``vaswani_transformer`` or
    of a model class derived from it) or runs the plugin's task (``vaswani_translation`` or a
    task derived from it)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    from ..models.vaswani_transformer import VaswaniTransformerModel
    from ..tasks.vaswani_translation import VaswaniTranslationTask

    if cfg is None:
        return False
    arch = _selected_name(cfg, "model", "arch")
    model = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch) if arch else None
    if isinstance(model, type) and issubclass(model, VaswaniTransformerModel):
        return True
    task_name = _selected_name(cfg, "task", "task")
    task = TASK_REGISTRY.get(task_name) if task_name else None
    return isinstance(task, type) and issubclass(task, VaswaniTranslationTask)


def is_our_task(task: Any) -> bool:
    """Whether ``task`` (an instance) is the plugin's task or one derived from it."""
    from ..tasks.vaswani_translation import VaswaniTranslationTask

    return isinstance(task, VaswaniTranslationTask)


def is_our_checkpoint(source: Any) -> bool:
    """Whether a checkpoint, given as its state or as a local file, was written by one of our
    runs (its configuration, read from the file without building anything it holds)."""
    from ..files.training_state import checkpoint_entries

    if isinstance(source, dict):
        return is_our_run(source.get("cfg"))
    try:
        entries = checkpoint_entries(source)
    except TypeError:  # not a path
        return False
    return entries is not None and is_our_run(entries.get("cfg"))


# -- how a wrapped call tells whose run it belongs to: each takes the call's arguments, and says
# in a few words (``told_by``, shown by the patch listing) what it reads


def _reads(words: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    def mark(function: Callable[..., bool]) -> Callable[..., bool]:
        function.told_by = words  # type: ignore[attr-defined]
        return function

    return mark


@_reads("the trainer's configuration")
def trainer_call(trainer: Any, *args: Any, **kwargs: Any) -> bool:
    """The trainer's configuration (a method of fairseq's ``Trainer``); decided once per
    trainer."""
    ours = trainer.__dict__.get("_vaswani_our_run")
    if ours is None:
        ours = trainer.__dict__["_vaswani_our_run"] = is_our_run(trainer.cfg)
    return ours


@_reads("the configuration the trainer is made with")
def trainer_construction(trainer: Any, cfg: Any, *args: Any, **kwargs: Any) -> bool:
    """The configuration given to ``Trainer.__init__`` (remembered for the trainer's later
    calls)."""
    ours = trainer.__dict__["_vaswani_our_run"] = is_our_run(cfg)
    return ours


@_reads("the configuration of the trainer it is given")
def trainer_argument(cfg: Any, trainer: Any, *args: Any, **kwargs: Any) -> bool:
    """The configuration of the trainer passed second (``checkpoint_utils.load_checkpoint(cfg,
    trainer)``, ``save_checkpoint(cfg, trainer, ...)``, ``fairseq_cli.train.train(cfg,
    trainer, ...)``)."""
    return trainer_call(trainer)


@_reads("the command's configuration")
def configuration(cfg: Any, *args: Any, **kwargs: Any) -> bool:
    """The run's configuration, passed first (a command's ``main(cfg)``)."""
    return is_our_run(cfg)


@_reads("the configuration in the state being saved")
def saved_state(obj: Any, *args: Any, **kwargs: Any) -> bool:
    """The configuration inside the state being saved (``torch_persistent_save(obj, ...)``)."""
    return isinstance(obj, dict) and is_our_run(obj.get("cfg"))


@_reads("the configuration in the checkpoint being read")
def checkpoint_file(path: Any, *args: Any, **kwargs: Any) -> bool:
    """The configuration stored in the checkpoint file being read."""
    return is_our_checkpoint(path)


@_reads("the task, else the configuration in the checkpoints")
def ensemble(filenames: Any, arg_overrides: Any = None, task: Any = None, *args: Any,
             **kwargs: Any) -> bool:
    """The task the checkpoints are loaded for, or any of the checkpoints (a state given with
    ``state=``, else the files)."""
    if is_our_task(task):
        return True
    state = kwargs.get("state")
    if state is not None:
        return is_our_checkpoint(state)
    return any(is_our_checkpoint(str(name)) for name in filenames or ())


@_reads("the models, under another task than ours")
def stock_generator_of_our_model(task: Any, models: Any, args: Any, seq_gen_cls: Any = None,
                                 *rest: Any, **kwargs: Any) -> bool:
    """A generator that another task (fairseq's ``translation``) builds for one of our models
    with fairseq's own generator class: our task builds its own, and a stock model keeps
    fairseq's."""
    from ..models.vaswani_transformer import VaswaniTransformerModel

    return (seq_gen_cls is None and kwargs.get("seq_gen_cls") is None and not is_our_task(task)
            and any(isinstance(model, VaswaniTransformerModel) for model in models or ()))
