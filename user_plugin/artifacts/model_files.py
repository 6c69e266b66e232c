"""The one reader of trained models: which files a model is, decided without guessing.

Every door (``vaswani-translate``, ``vaswani-serve``, ``vaswani-export``,
``vaswani-plot-attention``, ``vaswani-package`` and the hub) opens a model through
:func:`open_model`. It accepts:

* a **model package** (:mod:`.package`): complete by construction; every file is checked
  against its manifest (size and sha256) before use, and options that would name other files
  (``checkpoints``, ``data_dir``, a subword model) are refused;
* a **checkpoint file**, with the dictionaries ``dict.<src>.txt`` / ``dict.<tgt>.txt`` in
  ``data_dir`` (a ``fairseq-preprocess`` output) or beside it;
* a **folder holding exactly one checkpoint** (``*.pt``); a folder holding several is refused
  with their names and the option that picks one (``checkpoints=``, paths relative to the
  folder or absolute; several = an ensemble).

Outside a package, the text pipeline is the ``text_pipeline.json`` record beside the checkpoint
or in the data directory (:func:`model_text_pipeline`), else the recipes' pipeline on the
subword model given or found there by its usual names (:data:`BPE_CODES_NAMES`,
:data:`SENTENCEPIECE_NAMES`), said in one warning line. Dictionaries of subword pieces
(``@@`` or ``▁``) without the subword model are refused, and BPE codes are checked against the
dictionaries (codes of another run would make every word unknown).

The language pair comes from the package, the keywords, the checkpoint's task, or the binarized
file names in the data directory (:func:`language_pair`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import ArtifactError, read_json
from .text_pipeline import RECORD_NAME, TextPipeline, find_record

logger = logging.getLogger(__name__)

BPE_CODES_NAMES = ("bpecodes", "bpe.codes", "codes", "code")
SENTENCEPIECE_NAMES = ("sentencepiece.bpe.model", "spm.model")
#: A checkpoint file's suffix.
CHECKPOINT_SUFFIX = ".pt"
#: How many subword-marked tokens make a dictionary one of subword pieces.
SUBWORD_MARKED_SHARE = 0.05


@dataclass
class ModelFiles:
    """The files a model is opened from (every path exists): its checkpoints, the folder of its
    dictionaries, the subword model given or found, where its text pipeline record may be, and
    a package's manifest (None for anything else)."""

    checkpoints: list[Path]
    data_dir: Path
    bpe_codes: Path | None = None
    sentencepiece_model: Path | None = None
    record_dirs: list[Path] = field(default_factory=list)
    manifest: dict | None = None
    given_subword: bool = False

    def inputs(self) -> list[Path]:
        """Every file the model is read from but the checkpoints (for the output rule)."""
        found = [path for path in (self.bpe_codes, self.sentencepiece_model) if path]
        found += sorted(self.data_dir.glob("dict.*.txt"))
        found += [directory / RECORD_NAME for directory in self.record_dirs
                  if (directory / RECORD_NAME).is_file()]
        return found

    def checkpoint_sha256(self) -> list[str]:
        """The sha256 of each checkpoint: a package's from its checked manifest, else read."""
        from .digests import sha256_of

        if self.manifest is not None:
            return [self.manifest["files"][path.name]["sha256"] for path in self.checkpoints]
        return [sha256_of(path) for path in self.checkpoints]

    def read_states(self) -> list[dict]:
        """Each checkpoint's state, read and verified (every record's CRC-32); a package's also
        checked against its manifest (:func:`.package.package_state_problem`): one-line
        :class:`ArtifactError` naming the file."""
        from .checkpoints import read_model_checkpoint

        states = [read_model_checkpoint(path) for path in self.checkpoints]
        if self.manifest is not None:
            from .package import package_state_problem

            problem = package_state_problem(self.data_dir, self.manifest, states)
            if problem is not None:
                raise ArtifactError(problem)
        return states

    def language_pair(self, state: Mapping | None, source_lang: str | None = None,
                      target_lang: str | None = None) -> tuple[str, str]:
        """The (source, target) languages: a package's (a different one asked is refused),
        else :func:`language_pair` of the data directory and the checkpoint's task."""
        if self.manifest is not None:
            pair = (self.manifest["source_lang"], self.manifest["target_lang"])
            asked = (source_lang or pair[0], target_lang or pair[1])
            if asked != pair:
                raise ArtifactError(
                    f"{self.data_dir} is a model package of {pair[0]}->{pair[1]}: it cannot "
                    f"translate {asked[0]}->{asked[1]} (drop --source-lang/--target-lang)")
            return pair
        task_cfg = state["cfg"].task if state is not None else None
        return language_pair(self.data_dir, source_lang, target_lang, task_cfg)

    def text_pipeline(self, source_lang: str, target_lang: str,
                      moses: bool | None = None) -> tuple[TextPipeline, str | None]:
        """The model's text pipeline (subword model opened) and the one line to tell the user
        when it is assumed rather than recorded (:func:`model_text_pipeline`). Refused: no
        subword model for dictionaries of subword pieces; BPE codes the dictionaries lack."""
        dictionaries = [self.data_dir / f"dict.{lang}.txt" for lang in (source_lang, target_lang)]
        record = find_record(*self.record_dirs)
        if record is None and self.bpe_codes is None and self.sentencepiece_model is None:
            refuse_pieces_without_subword_model(dictionaries, self.record_dirs)
        pipeline, note = model_text_pipeline(
            self.record_dirs, source_lang, target_lang,
            bpe_codes=self.bpe_codes if self.given_subword else None,
            sentencepiece_model=self.sentencepiece_model if self.given_subword else None,
            moses=moses, found=(self.bpe_codes, self.sentencepiece_model))
        if pipeline.subword == "bpe" and pipeline.model_path is not None:
            from ..files.dictionaries import bpe_codes_problem

            problem = bpe_codes_problem(pipeline.model_path, dictionaries)
            if problem is not None:
                raise ArtifactError(f"{problem}: not the codes of this model")
        return pipeline, note


def _first_existing(directory: Path, names: Iterable[str]) -> Path | None:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    return None


def _first_existing_in(places: Sequence[Path], names: Iterable[str]) -> Path | None:
    for place in places:
        found = _first_existing(place, names)
        if found is not None:
            return found
    return None


def _resolve(directory: Path, name: str | os.PathLike) -> Path:
    path = Path(name)
    return path if path.is_absolute() else directory / path


WHAT_TO_GIVE = ("a model package (vaswani-package), a checkpoint file with --data-dir, or a "
                "folder holding one checkpoint")


def _package_files(path: Path, **given: object) -> ModelFiles:
    from .package import read_package

    named = [name for name, value in given.items() if value is not None]
    if named:
        option = "--" + named[0].replace("_", "-")
        raise ArtifactError(f"{path} is a model package: it holds its checkpoints, dictionaries "
                            f"and subword model, so {option} is not for it (drop it)")
    manifest = read_package(path)
    return ModelFiles([path / name for name in manifest["models"]], path, record_dirs=[path],
                      manifest=manifest)


def _export_kind(folder: Path) -> str | None:
    """What an export directory of ours is and how it is opened, from its manifest's format;
    None for any other folder."""
    from . import ctranslate2_layout, transformers_layout
    from .manifest import MANIFEST

    if not (folder / MANIFEST).is_file():
        return None
    try:
        found = read_json(folder / MANIFEST, "manifest").get("format")
    except (ArtifactError, AttributeError):
        return None
    if found == ctranslate2_layout.FORMAT:
        return ("a CTranslate2 export: translate it with --backend ctranslate2 (the hub's "
                "backend=\"ctranslate2\")")
    if found == transformers_layout.FORMAT:
        return ("a Hugging Face transformers export: load it with transformers "
                "(docs/export.md), or translate the model package it came from")
    return None


def folder_checkpoints(folder: Path) -> list[Path]:
    """The checkpoint files directly in ``folder``, by name."""
    return sorted(path for path in folder.iterdir()
                  if path.suffix == CHECKPOINT_SUFFIX and path.is_file()
                  and not path.name.startswith("."))


def open_model(
    model: str | os.PathLike,
    checkpoints: Sequence[str | os.PathLike] | None = None,
    data_dir: str | os.PathLike | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
) -> ModelFiles:
    """The files of ``model`` (see the module docstring); a one-line :class:`ArtifactError`
    naming what was found and what to pass when they are missing, damaged or ambiguous."""
    from .package import is_package

    model = Path(model)
    if model.is_dir() and is_package(model):
        return _package_files(model, checkpoints=checkpoints, data_dir=data_dir,
                              bpe_codes=bpe_codes, sentencepiece_model=sentencepiece_model)
    if model.is_file():
        if checkpoints is not None:
            given = [Path(path) for path in checkpoints]
            if [path.resolve() for path in given] != [model.resolve()]:
                raise ArtifactError(f"{model} is a checkpoint file: give either it or "
                                    "--checkpoints, not both")
        folder, paths = model.parent, [model]
    elif model.is_dir():
        folder = model
        if checkpoints is None:
            paths = folder_checkpoints(folder)
            if not paths:
                export = _export_kind(model)
                if export is not None:
                    raise ArtifactError(f"{model} is {export}")
                raise ArtifactError(f"{model}: no checkpoint (*{CHECKPOINT_SUFFIX}) and no "
                                    f"model package manifest in it; give {WHAT_TO_GIVE}")
            if len(paths) > 1:
                names = ", ".join(path.name for path in paths[:6])
                more = f" and {len(paths) - 6} more" if len(paths) > 6 else ""
                raise ArtifactError(
                    f"{model} holds {len(paths)} checkpoints ({names}{more}): pick one with "
                    "--checkpoints NAME (several: an ensemble), or give a model package "
                    "(vaswani-package)")
        else:
            paths = [_resolve(folder, name) for name in checkpoints]
            if not paths:
                raise ArtifactError("checkpoints= is empty")
    else:
        raise ArtifactError(f"{model}: no such file or directory (give {WHAT_TO_GIVE})")
    for path in paths:
        if not path.is_file():
            raise ArtifactError(f"checkpoint not found: {path}")
    data_path = Path(data_dir) if data_dir is not None else folder
    if not data_path.is_dir():
        raise ArtifactError(f"data directory not found: {data_path}")
    if bpe_codes is not None and sentencepiece_model is not None:
        raise ArtifactError("give either BPE codes or a SentencePiece model, not both")
    places = list(dict.fromkeys([folder, data_path]))
    given = bpe_codes is not None or sentencepiece_model is not None
    if given:
        bpe_path = None if bpe_codes is None else Path(bpe_codes)
        spm_path = None if sentencepiece_model is None else Path(sentencepiece_model)
        for path in (bpe_path, spm_path):
            if path is not None and not path.is_file():
                raise ArtifactError(f"file not found: {path}")
    else:
        bpe_path = _first_existing_in(places, BPE_CODES_NAMES)
        spm_path = _first_existing_in(places, SENTENCEPIECE_NAMES)
        if bpe_path is not None and spm_path is not None and find_record(*places) is None:
            raise ArtifactError(f"found both BPE codes ({bpe_path}) and a SentencePiece model "
                                f"({spm_path}): give the one the model was trained with "
                                "(--bpe-codes or --sentencepiece-model)")
    return ModelFiles(paths, data_path, bpe_path, spm_path, places, given_subword=given)


def subword_marks(symbols: Sequence[str]) -> str | None:
    """Which subword method a dictionary's tokens show: ``"bpe"`` when many end in subword-nmt's
    ``@@``, ``"sentencepiece"`` when many start with its ``▁``, else None."""
    if not symbols:
        return None
    least = max(1, int(len(symbols) * SUBWORD_MARKED_SHARE))
    if sum(symbol.endswith("@@") for symbol in symbols) >= least:
        return "bpe"
    if sum(symbol.startswith("\u2581") for symbol in symbols) >= least:
        return "sentencepiece"
    return None


def refuse_pieces_without_subword_model(dictionaries: Sequence[Path],
                                        places: Sequence[Path]) -> None:
    """A one-line :class:`ArtifactError` when the dictionaries hold subword pieces but no
    subword model was found: raw text would reach the model as whole words, and its output
    would keep the pieces."""
    from ..files.dictionaries import dictionary_symbols

    for path in dictionaries:
        try:
            marks = subword_marks(dictionary_symbols(path))
        except (OSError, UnicodeDecodeError):
            continue  # the task's reader names an unreadable dictionary
        if marks is not None:
            where = " or ".join(str(place) for place in places)
            names, option = ((BPE_CODES_NAMES, "--bpe-codes") if marks == "bpe"
                             else (SENTENCEPIECE_NAMES, "--sentencepiece-model"))
            raise ArtifactError(
                f"{path} holds {'BPE' if marks == 'bpe' else 'SentencePiece'} pieces, but "
                f"no {RECORD_NAME} and no subword model ({', '.join(names)}) is in {where}: "
                f"pass {option} with the one the data was prepared with, or use the model "
                "package")


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
            raise ArtifactError(f"dictionary not found: {data_dir / f'dict.{lang}.txt'} (pass "
                                "--data-dir, the folder of the model's dictionaries, or use "
                                "the model package)")
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
    """The text pipeline an export ships with a checkpoint: :meth:`ModelFiles.text_pipeline`
    of :func:`open_model`, the warning line said when it is assumed."""
    for path in (bpe_codes, sentencepiece_model):
        if path is not None and not Path(path).is_file():
            raise ArtifactError(f"{path}: no such file")
    given = [None if path is None else Path(path).resolve()
             for path in (bpe_codes, sentencepiece_model)]
    files = open_model(checkpoint, data_dir=data_dir, bpe_codes=given[0],
                       sentencepiece_model=given[1])
    pipeline, note = files.text_pipeline(source_lang, target_lang, moses)
    if note is not None:
        logger.warning(note)
    return pipeline
