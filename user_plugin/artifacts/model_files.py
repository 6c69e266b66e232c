"""The files of a model directory: checkpoints, dictionaries, subword model, language pair.

A model directory holds (names tried in this order, each overridable by a keyword of
:func:`find_model_files`):

* checkpoints: :data:`CHECKPOINT_NAMES` (or ``checkpoints=``, paths relative to the directory
  or absolute; several = an ensemble);
* the dictionaries ``dict.<src>.txt`` and ``dict.<tgt>.txt`` (or ``data_dir=`` a
  ``fairseq-preprocess`` output);
* an optional subword model: subword-nmt codes :data:`BPE_CODES_NAMES` (``bpe_codes=``), or a
  SentencePiece model :data:`SENTENCEPIECE_NAMES` (``sentencepiece_model=``);
* the text pipeline record ``text_pipeline.json`` that the recipes write (in the model directory
  or the data directory), naming the subword model beside it (:func:`model_text_pipeline`).

The language pair comes from the keywords, the checkpoint's task, or the binarized file names
in the data directory (:func:`language_pair`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import ArtifactError
from .text_pipeline import RECORD_NAME, TextPipeline, find_record

logger = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt", "checkpoint_avg.pt")
BPE_CODES_NAMES = ("bpecodes", "bpe.codes", "codes", "code")
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
    docstring); a :class:`ArtifactError` naming the first one that is missing."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ArtifactError(f"model directory not found: {model_dir}")
    if checkpoints is None:
        found = _first_existing(model_dir, CHECKPOINT_NAMES)
        if found is None:
            raise ArtifactError(f"no checkpoint ({', '.join(CHECKPOINT_NAMES)}) in {model_dir}")
        paths = [found]
    else:
        paths = [_resolve(model_dir, name) for name in checkpoints]
        if not paths:
            raise ArtifactError("checkpoints= is empty")
    data_path = Path(data_dir) if data_dir is not None else model_dir
    if not data_path.is_dir():
        raise ArtifactError(f"data directory not found: {data_path}")
    bpe_path = (_resolve(model_dir, bpe_codes) if bpe_codes is not None
                else _first_existing(model_dir, BPE_CODES_NAMES))
    spm_path = (_resolve(model_dir, sentencepiece_model) if sentencepiece_model is not None
                else _first_existing(model_dir, SENTENCEPIECE_NAMES))
    for path in (bpe_path, spm_path):
        if path is not None and not path.is_file():
            raise ArtifactError(f"file not found: {path}")
    for path in paths:
        if not path.is_file():
            raise ArtifactError(f"checkpoint not found: {path}")
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
    if src is None or tgt is None:
        inferred = data_utils.infer_language_pair(str(data_dir))
        src, tgt = src or inferred[0], tgt or inferred[1]
    if trained is not None and None not in (src, tgt) and (src, tgt) != trained:
        logger.warning(f"translating {src}->{tgt}, but the checkpoint was trained "
                       f"{trained[0]}->{trained[1]}")
    if src is None or tgt is None:
        raise ArtifactError(
            f"cannot tell the language pair of {data_dir}: pass source_lang= and target_lang="
        )
    for lang in (src, tgt):
        if not (data_dir / f"dict.{lang}.txt").is_file():
            raise ArtifactError(f"dictionary not found: {data_dir / f'dict.{lang}.txt'}")
    return src, tgt


def model_text_pipeline(
    directories: Sequence[Path | None], source_lang: str, target_lang: str,
    bpe_codes: Path | None = None, sentencepiece_model: Path | None = None,
    moses: bool | None = None, found: tuple[Path | None, Path | None] = (None, None),
) -> tuple[TextPipeline, str | None]:
    """The text pipeline a model was trained with, and the one line to tell the user when it is
    assumed rather than recorded.

    The first :data:`~.text_pipeline.RECORD_NAME` of ``directories`` is read (its subword model
    found beside it and checked by sha256; a given ``bpe_codes`` / ``sentencepiece_model`` must
    be that same file by content); a record that predates the Unicode normalization setting
    is used as it is, with the line of :meth:`TextPipeline.normalization_note` to tell. Without
    a record (older runs, hand-made directories) the recipes' pipeline
    (:meth:`TextPipeline.recipe`) is assumed on the subword model given, else on ``found``
    (the BPE codes and SentencePiece model found by their usual names).
    ``moses`` overrides Moses tokenization either way."""
    given = bpe_codes if bpe_codes is not None else sentencepiece_model
    if bpe_codes is not None and sentencepiece_model is not None:
        raise ArtifactError("give either BPE codes or a SentencePiece model, not both")
    record = find_record(*directories)
    note = None
    if record is not None:
        pipeline = TextPipeline.load(record)
        note = pipeline.normalization_note(record)
        if given is not None:
            pipeline = pipeline.with_model_file(given)
        if (pipeline.source_lang, pipeline.target_lang) != (source_lang, target_lang):
            logger.warning(f"{record} was written for {pipeline.source_lang}->"
                           f"{pipeline.target_lang}; translating {source_lang}->{target_lang}")
            pipeline = replace(pipeline, source_lang=source_lang, target_lang=target_lang)
    else:
        if given is None:
            bpe_codes, sentencepiece_model = found
            given = bpe_codes if bpe_codes is not None else sentencepiece_model
        subword = ("bpe" if bpe_codes is not None else
                   "sentencepiece" if sentencepiece_model is not None else "none")
        pipeline = TextPipeline.recipe(source_lang, target_lang, subword, given)
        where = " or ".join(str(d) for d in dict.fromkeys(d for d in directories if d))
        note = (f"no {RECORD_NAME} in {where}: assuming the recipes' text pipeline "
                f"({{describe}})")
    if moses is not None and moses != pipeline.moses_tokenize:
        pipeline = replace(pipeline, moses_tokenize=moses)
    if note is not None and record is None:
        note = note.format(describe=pipeline.describe())
    return pipeline.open_subword_model(), note


def checkpoint_text_pipeline(
    checkpoint: str | os.PathLike, data_dir: str | os.PathLike, source_lang: str,
    target_lang: str, bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None, moses: bool | None = None,
) -> TextPipeline:
    """The text pipeline an export ships with a checkpoint: the record beside the checkpoint or
    in ``data_dir`` (:func:`model_text_pipeline`), else the recipes' pipeline on the subword
    model given or found there by its usual names, with one warning line saying so."""
    places = [Path(checkpoint).parent, Path(data_dir)]
    given = [None if path is None else Path(path) for path in (bpe_codes, sentencepiece_model)]
    for path in given:
        if path is not None and not path.is_file():
            raise ArtifactError(f"{path}: no such file")
    found = tuple(_first_existing_in(places, names)
                  for names in (BPE_CODES_NAMES, SENTENCEPIECE_NAMES))
    if given == [None, None] and None not in found and find_record(*places) is None:
        raise ArtifactError(f"found both BPE codes ({found[0]}) and a SentencePiece model "
                            f"({found[1]}): give the one the model was trained with "
                            "(--bpe-codes or --sentencepiece-model)")
    pipeline, note = model_text_pipeline(places, source_lang, target_lang, given[0], given[1],
                                         moses=moses, found=found)  # type: ignore[arg-type]
    if note is not None:
        logger.warning(note)
    return pipeline


def _first_existing_in(places: Sequence[Path], names: Iterable[str]) -> Path | None:
    for place in places:
        found = _first_existing(place, names)
        if found is not None:
            return found
    return None
