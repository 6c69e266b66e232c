"""The files of a model directory: checkpoints, dictionaries, subword model, language pair.

A model directory holds (names tried in this order, each overridable by a keyword of
:func:`find_model_files`):

* checkpoints: :data:`CHECKPOINT_NAMES` (or ``checkpoints=``, paths relative to the directory
  or absolute; several = an ensemble);
* the dictionaries ``dict.<src>.txt`` and ``dict.<tgt>.txt`` (or ``data_dir=`` a
  ``fairseq-preprocess`` output);
* an optional subword model: subword-nmt codes :data:`BPE_CODES_NAMES` (``bpe_codes=``), or a
  SentencePiece model :data:`SENTENCEPIECE_NAMES` (``sentencepiece_model=``).

The language pair comes from the keywords, the checkpoint's task, or the binarized file names
in the data directory (:func:`language_pair`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import HubError

logger = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt")
BPE_CODES_NAMES = ("bpecodes", "codes", "code")
SENTENCEPIECE_NAMES = ("sentencepiece.bpe.model", "spm.model")


@dataclass
class ModelFiles:
    """The files a translator is loaded from; every path exists."""

    checkpoints: list[Path]
    data_dir: Path
    bpe_codes: Path | None = None
    sentencepiece_model: Path | None = None


def _first_existing(directory: Path, names: Iterable[str]) -> Path | None:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    return None


def _resolve(directory: Path, name: str | os.PathLike) -> Path:
    path = Path(name)
    return path if path.is_absolute() else directory / path


def find_model_files(
    model_dir: str | os.PathLike,
    checkpoints: Sequence[str | os.PathLike] | None = None,
    data_dir: str | os.PathLike | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
) -> ModelFiles:
    """The checkpoints, data directory and subword model of ``model_dir`` (see the module
    docstring); a :class:`HubError` naming the first one that is missing."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise HubError(f"model directory not found: {model_dir}")
    if checkpoints is None:
        found = _first_existing(model_dir, CHECKPOINT_NAMES)
        if found is None:
            raise HubError(f"no checkpoint ({', '.join(CHECKPOINT_NAMES)}) in {model_dir}")
        paths = [found]
    else:
        paths = [_resolve(model_dir, name) for name in checkpoints]
        if not paths:
            raise HubError("checkpoints= is empty")
    data_path = Path(data_dir) if data_dir is not None else model_dir
    if not data_path.is_dir():
        raise HubError(f"data directory not found: {data_path}")
    bpe_path = (_resolve(model_dir, bpe_codes) if bpe_codes is not None
                else _first_existing(model_dir, BPE_CODES_NAMES))
    spm_path = (_resolve(model_dir, sentencepiece_model) if sentencepiece_model is not None
                else _first_existing(model_dir, SENTENCEPIECE_NAMES))
    for path in (bpe_path, spm_path):
        if path is not None and not path.is_file():
            raise HubError(f"file not found: {path}")
    for path in paths:
        if not path.is_file():
            raise HubError(f"checkpoint not found: {path}")
    return ModelFiles(paths, data_path, bpe_path, spm_path)


def trained_direction(task_cfg: Mapping, data_dir: Path) -> tuple[str, str] | None:
    """The (source, target) a checkpoint was trained on: its task configuration's languages,
    else those of the binarized files (``train.<src>-<tgt>.*``) of its own data directory if it
    is still there, else of ``data_dir``; None when nothing tells."""
    from fairseq.data import data_utils

    saved = (task_cfg.get("source_lang"), task_cfg.get("target_lang"))
    if None not in saved:
        return saved
    for directory in (task_cfg.get("data"), data_dir):
        if directory and Path(str(directory).split(":")[0]).is_dir():
            inferred = data_utils.infer_language_pair(str(directory).split(":")[0])
            if None not in inferred:
                return inferred[0], inferred[1]
    return None


def language_pair(
    data_dir: Path, source_lang: str | None, target_lang: str | None,
    task_cfg: Mapping | None = None,
) -> tuple[str, str]:
    """The (source, target) languages: the given ones, else the checkpoint's task
    configuration's, else those of the binarized files in ``data_dir``. Both dictionaries
    ``dict.<lang>.txt`` must be in ``data_dir``. A direction other than the checkpoint's is
    logged as a warning (a model trained en->de given de->en translates badly, silently)."""
    from fairseq.data import data_utils

    saved = task_cfg or {}
    src = source_lang or saved.get("source_lang")
    tgt = target_lang or saved.get("target_lang")
    trained = trained_direction(saved, data_dir)
    if trained is not None and (src, tgt) != trained:
        logger.warning(f"translating {src}->{tgt}, but the checkpoint was trained "
                       f"{trained[0]}->{trained[1]}")
    if src is None or tgt is None:
        inferred = data_utils.infer_language_pair(str(data_dir))
        src, tgt = src or inferred[0], tgt or inferred[1]
    if src is None or tgt is None:
        raise HubError(
            f"cannot tell the language pair of {data_dir}: pass source_lang= and target_lang="
        )
    for lang in (src, tgt):
        if not (data_dir / f"dict.{lang}.txt").is_file():
            raise HubError(f"dictionary not found: {data_dir / f'dict.{lang}.txt'}")
    return src, tgt
