"""Loading a translator from a model directory: its files, then the checkpoints' task and
models through fairseq, then the text codec.

Decoding defaults are the paper's: beam 4, GNMT length penalty with alpha 0.6, at most source
length + 50 output tokens per sentence (the ``vaswani_translation`` task's generator).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .. import registration  # noqa: F401  (the models, task and criterion checkpoints name)
from ..files.checkpoints import LOAD_ERRORS, CheckpointError, read_checkpoint, state_dict_mismatch
from ..files.errors import UserError, first_line
from ..files.fingerprint import ensemble_mismatch, stored_fingerprint
from ..tasks.vaswani_translation import TASK_NAME
from .errors import HubError
from .model_files import find_model_files, language_pair
from .text_codec import TextCodec
from .translator import TextTranslator, Translator


def read_model_checkpoint(path: Path) -> dict:
    """A checkpoint with its ``cfg`` and ``model``, upgraded by fairseq as its loaders do; a
    :class:`HubError` (``cannot read checkpoint PATH: ...``) when it cannot be used."""
    try:
        return read_checkpoint(path, upgrade=True, required=("cfg", "model"))
    except CheckpointError as error:
        raise HubError(f"cannot read checkpoint {error.path}: {error.problem}") from None
    except UserError as error:
        raise HubError(str(error)) from None


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
        raise HubError(
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
    mode. A checkpoint that does not fit (another vocabulary than the dictionaries...) is a
    :class:`HubError` naming the first mismatched parameter and both shapes."""
    from fairseq import checkpoint_utils

    models = []
    for path, state in zip(paths, states):
        try:
            loaded, _, _ = checkpoint_utils.load_model_ensemble_and_task(
                [str(path)], task=task, state=state
            )
        except LOAD_ERRORS as exc:
            reason = parameter_mismatch(task, state) or first_line(exc, with_type=True)
            raise HubError(f"cannot build the model of {path}: {reason}") from None
        model = loaded[0].to(device)
        model.eval()
        models.append(model)
    return models


def load_translator(
    model_dir: str | os.PathLike,
    checkpoints: Sequence[str | os.PathLike] | None = None,
    data_dir: str | os.PathLike | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
    moses: bool | None = None,
    beam: int = 4,
    lenpen: float = 0.6,
    length_penalty_form: str = "gnmt",
    max_len_over_source: int = 50,
    batch_size: int = 64,
    max_tokens: int | None = None,
    device: str = "cpu",
    backend: str = "fairseq",
) -> TextTranslator:
    """Load a model directory (see :mod:`user_plugin.hub.model_files`); raises
    :class:`HubError` naming the file when something is missing or unreadable.

    Text goes through sacremoses unless a SentencePiece model is used (``moses=`` overrides).
    ``backend="ctranslate2"`` loads a CTranslate2 export directory instead
    (:mod:`user_plugin.hub.ctranslate2_translator`), with the same text pipeline and decoding
    defaults.
    """
    if backend == "ctranslate2":
        from .ctranslate2_translator import CTranslate2Translator, open_export

        if checkpoints is not None or data_dir is not None or max_tokens is not None:
            raise HubError("checkpoints=, data_dir= and max_tokens= belong to the fairseq "
                           "backend: a CTranslate2 export holds its model and vocabularies")
        engine, codec, manifest = open_export(model_dir, source_lang, target_lang, bpe_codes,
                                              sentencepiece_model, moses, device)
        return CTranslate2Translator(
            engine, codec, manifest, beam=beam, lenpen=lenpen, batch_size=batch_size,
            length_penalty_form=length_penalty_form, max_len_over_source=max_len_over_source,
        )
    if backend != "fairseq":
        raise HubError(f"backend must be 'fairseq' or 'ctranslate2', got {backend!r}")
    files = find_model_files(model_dir, checkpoints, data_dir, bpe_codes, sentencepiece_model)
    states = [read_model_checkpoint(path) for path in files.checkpoints]
    mismatch = ensemble_mismatch([(path, stored_fingerprint(state))
                                  for path, state in zip(files.checkpoints, states)])
    if mismatch is not None:
        raise HubError(mismatch)
    task_cfg = states[0]["cfg"].task
    src, tgt = language_pair(files.data_dir, source_lang, target_lang, task_cfg)
    task = setup_task(task_cfg, files.data_dir, src, tgt, length_penalty_form,
                      max_len_over_source)
    models = build_models(task, files.checkpoints, states, device)
    codec = TextCodec(
        src, tgt, moses=(files.sentencepiece_model is None) if moses is None else moses,
        bpe_codes=files.bpe_codes, sentencepiece_model=files.sentencepiece_model,
    )
    return Translator(task, models, codec, beam=beam, lenpen=lenpen, batch_size=batch_size,
                      max_tokens=max_tokens)
