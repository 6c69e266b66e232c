"""Reading trained checkpoints for translation and export: a checkpoint with its configuration,
the ``vaswani_translation`` task on a data directory, and the models built from both, each
failure one :class:`~.errors.ArtifactError` line naming the file."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..files.checkpoints import LOAD_ERRORS, CheckpointError, read_checkpoint, state_dict_mismatch
from ..files.errors import UserError, first_line
from ..files.fingerprint import distinct_parameters, duplicate_note, parameters_sha256
from ..tasks.vaswani_translation import TASK_NAME
from .errors import ArtifactError

logger = logging.getLogger(__name__)


def read_model_checkpoint(path: Path) -> dict:
    """A checkpoint with its ``cfg`` and ``model``, upgraded by fairseq as its loaders do; a
    :class:`ArtifactError` (``cannot read checkpoint PATH: ...``) when it cannot be used."""
    try:
        return read_checkpoint(path, upgrade=True, required=("cfg", "model"))
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
