"""The text pipeline of a model: everything between a raw sentence and the model's tokens.

A model sees text the way its training data was prepared (paper §5.1: Moses-tokenized and
byte-pair encoded for EN-DE, word pieces for EN-FR). A :class:`TextPipeline` holds every step of
that preparation, so that the recipes' prepare step, the hub's two backends and every export
encode a raw sentence in exactly one way:

0. a Unicode normalization form, NFC for every pipeline made now (``unicode_normalization``):
   the same word typed with precomposed letters (``ü``, as most keyboards and corpora give it)
   or decomposed ones (``u`` + combining diaeresis, as macOS file names and some editors give
   it) becomes the same characters, hence the same subwords, at training and serving alike;
1. whitespace made single spaces (:func:`~user_plugin.files.text.single_line`);
2. Moses punctuation normalization (sacremoses ``MosesPunctNormalizer``, control characters
   removed) when ``normalize_punctuation``;
3. lowercasing when ``lowercase`` (the case handling; the recipes keep case);
4. Moses tokenization (sacremoses ``MosesTokenizer`` of the side's language) when
   ``moses_tokenize``, with ``aggressive_dash_splits`` (``well-known`` -> ``well @-@ known``)
   and ``escape`` (``'`` -> ``&apos;``) as recorded;
5. the subword method: subword-nmt BPE codes (``bpe``), a SentencePiece model
   (``sentencepiece``) or none.

Decoding reverses 5 and 4 (subword removal, Moses detokenization), then applies the
normalization form to the output.

A record written before the normalization form was recorded has none (``None``): its data was
prepared without one, so text is encoded as typed, as it was then, and
:meth:`TextPipeline.normalization_note` gives the one line that says so.

The settings are recorded as JSON (:data:`RECORD_NAME`, format :data:`FORMAT`) beside the
prepared data, with the subword model's file name and sha256; the record travels with the
model (averaged model directory, every export). Loading a record finds the subword model beside
it and checks its sha256, so a model is never served with another model's codes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..files.atomic import atomic_write_text
from ..files.errors import first_line
from ..files.text import single_line
from .digests import sha256_of
from .errors import ArtifactError, read_json

#: The record's file name, beside the prepared data and in every model directory and export.
RECORD_NAME = "text_pipeline.json"
#: The record's format name.
FORMAT = "vaswani-text-pipeline/1"
#: The subword methods.
SUBWORD_METHODS = ("bpe", "sentencepiece", "none")
#: The Unicode normalization forms a pipeline may apply ("none": text as typed).
NORMALIZATION_FORMS = ("NFC", "NFKC", "NFD", "NFKD", "none")
#: The form of every pipeline made now: canonical composition, which changes no character's
#: meaning (NFKC would also fold compatibility characters such as ligatures and full-width
#: letters, which Moses and the subword models keep apart).
DEFAULT_NORMALIZATION = "NFC"
#: The file name an export gives the subword model of each method (the hub looks for these
#: first in a model directory).
SHIPPED_MODEL_NAMES = {"bpe": "bpecodes", "sentencepiece": "sentencepiece.bpe.model"}


def read_bpe_codes(path: Path):
    """subword-nmt's ``BPE`` of the codes file ``path``, or an :class:`ArtifactError` naming
    the file. subword-nmt reports a malformed line on stderr and calls ``sys.exit(1)``; its
    message becomes the error's reason. The file is read by the project's line rule."""
    from subword_nmt.apply_bpe import BPE

    messages = io.StringIO()
    try:
        with open(path, encoding="utf-8", newline="\n") as codes, \
                contextlib.redirect_stderr(messages):
            return BPE(codes)
    except SystemExit:
        reason = first_line(Exception(messages.getvalue())) or "malformed"
        reason = reason.removeprefix("Error: ")
    except UnicodeDecodeError:
        reason = "not valid UTF-8 text"
    except (OSError, ValueError, IndexError) as exc:
        reason = first_line(exc, with_type=True)
    raise ArtifactError(f"cannot read BPE codes {path}: {reason}")


def read_sentencepiece(path: Path):
    """sentencepiece's processor of the model file ``path``, or an :class:`ArtifactError`."""
    import sentencepiece

    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as exc:
        raise ArtifactError(f"cannot read SentencePiece model {path}: {first_line(exc)}") from None


@dataclass
class TextPipeline:
    """Raw text <-> model tokens, as the model's training data was prepared (module docstring).

    The fields are the record; ``model_path`` is where the subword model file is on this
    machine (not recorded: the record names the file by ``subword_model`` and sha256).
    """

    source_lang: str
    target_lang: str
    unicode_normalization: str | None = DEFAULT_NORMALIZATION
    normalize_punctuation: bool = True
    moses_tokenize: bool = True
    aggressive_dash_splits: bool = True
    escape: bool = False
    lowercase: bool = False
    subword: str = "bpe"
    subword_model: str | None = None
    subword_model_sha256: str | None = None
    model_path: Path | None = field(default=None, compare=False, repr=False)
    _tools: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.subword not in SUBWORD_METHODS:
            raise ArtifactError(f"unknown subword method {self.subword!r} "
                                f"(one of {', '.join(SUBWORD_METHODS)})")
        if self.unicode_normalization is not None and \
                self.unicode_normalization not in NORMALIZATION_FORMS:
            raise ArtifactError(f"unknown Unicode normalization {self.unicode_normalization!r} "
                                f"(one of {', '.join(NORMALIZATION_FORMS)})")

    # -- building -------------------------------------------------------------------------

    @classmethod
    def recipe(cls, source_lang: str, target_lang: str, subword: str,
               model_path: str | os.PathLike | None = None) -> TextPipeline:
        """The recipes' pipeline (recipes/steps/prepare.sh): NFC, Moses punctuation
        normalization, then for BPE Moses tokenization with aggressive dash splits and no
        escaping; SentencePiece reads the normalized text untokenized. Case is kept."""
        path = None if model_path is None else Path(model_path)
        return cls(
            source_lang, target_lang, unicode_normalization=DEFAULT_NORMALIZATION,
            normalize_punctuation=True,
            moses_tokenize=subword != "sentencepiece", aggressive_dash_splits=True,
            escape=False, lowercase=False, subword=subword,
            subword_model=None if path is None else path.name,
            subword_model_sha256=None if path is None else sha256_of(path), model_path=path,
        )

    @classmethod
    def from_files(cls, source_lang: str, target_lang: str, moses: bool,
                   bpe_codes: str | os.PathLike | None = None,
                   sentencepiece_model: str | os.PathLike | None = None) -> TextPipeline:
        """The pipeline of text prepared by hand, given by its files rather than by a record:
        NFC, Moses tokenization when ``moses`` (no punctuation normalization, no dash
        splitting, no escaping), and the subword model given (subword-nmt codes or a
        SentencePiece model, read now so that a malformed file fails here, naming it). Models
        trained by the recipes carry their own record instead."""
        if bpe_codes is not None and sentencepiece_model is not None:
            raise ArtifactError("give either BPE codes or a SentencePiece model, not both")
        subword = ("bpe" if bpe_codes is not None else
                   "sentencepiece" if sentencepiece_model is not None else "none")
        pipeline = cls(source_lang, target_lang, unicode_normalization=DEFAULT_NORMALIZATION,
                       normalize_punctuation=False, moses_tokenize=moses,
                       aggressive_dash_splits=False, subword=subword)
        given = bpe_codes if bpe_codes is not None else sentencepiece_model
        if given is None:
            return pipeline
        return pipeline.with_model_file(given).open_subword_model()

    def with_model_file(self, path: str | os.PathLike) -> TextPipeline:
        """This pipeline with its subword model at ``path`` (checked against the recorded
        sha256 when there is one)."""
        path = Path(path)
        if not path.is_file():
            raise ArtifactError(f"{path}: no such {self.subword} model file")
        digest = sha256_of(path)
        if self.subword_model_sha256 is not None and digest != self.subword_model_sha256:
            raise ArtifactError(
                f"{path}: not the {self.subword} model this model was trained with (sha256 "
                f"{digest[:12]}..., the text pipeline record says "
                f"{self.subword_model_sha256[:12]}...)")
        return replace(self, subword_model=self.subword_model or path.name,
                       subword_model_sha256=digest, model_path=path)

    # -- the record -----------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The JSON record of these settings (format, then the fields)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in ("model_path", "_tools")}
        return {"format": FORMAT, **values}

    def write(self, path: str | os.PathLike) -> Path:
        """Write the record to ``path`` (a file, or a directory to hold :data:`RECORD_NAME`),
        atomically; returns the file written."""
        path = Path(path)
        if path.is_dir():
            path = path / RECORD_NAME
        atomic_write_text(path, json.dumps(self.record(), indent=1, ensure_ascii=False) + "\n")
        return path

    def named_model(self, name: str) -> TextPipeline:
        """This pipeline with its subword model file called ``name`` (an export renames it)."""
        return replace(self, subword_model=name, model_path=self.model_path)

    def ship(self, directory: Path) -> str | None:
        """Copy the subword model into ``directory`` under :data:`SHIPPED_MODEL_NAMES` and write
        the record naming it (:data:`RECORD_NAME`), as every export does; returns the model's
        name there (None without a subword model)."""
        if self.subword == "none":
            self.write(directory / RECORD_NAME)
            return None
        name = SHIPPED_MODEL_NAMES[self.subword]
        shutil.copyfile(self.model_path, directory / name)
        self.named_model(name).write(directory / RECORD_NAME)
        return name

    @classmethod
    def from_record(cls, record: Any, where: str = "text pipeline record") -> TextPipeline:
        """The pipeline of a parsed record (without its subword model file located)."""
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise ArtifactError(f"{where}: not a text pipeline record of format {FORMAT}")
        names = {f.name for f in fields(cls)} - {"model_path", "_tools"}
        unknown = sorted(set(record) - names - {"format"})
        if unknown:
            raise ArtifactError(f"{where}: unknown setting {unknown[0]!r} (a newer format?)")
        for name in ("source_lang", "target_lang"):
            if not isinstance(record.get(name), str):
                raise ArtifactError(f"{where}: no {name}")
        values = {key: value for key, value in record.items() if key != "format"}
        # a record without the setting predates it: its text was not normalized
        values.setdefault("unicode_normalization", None)
        if not isinstance(values["unicode_normalization"], (str, type(None))):
            raise ArtifactError(f"{where}: unicode_normalization must be one of "
                                f"{', '.join(NORMALIZATION_FORMS)}, got "
                                f"{values['unicode_normalization']!r}")
        for name in ("normalize_punctuation", "moses_tokenize", "aggressive_dash_splits",
                     "escape", "lowercase"):
            if not isinstance(values.get(name, False), bool):
                raise ArtifactError(f"{where}: {name} must be true or false, got "
                                    f"{values[name]!r}")
        try:
            return cls(**values)
        except ArtifactError as error:
            raise ArtifactError(f"{where}: {error}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> TextPipeline:
        """Read a record file (or a directory's :data:`RECORD_NAME`) and locate its subword
        model beside it, checked by sha256; an :class:`ArtifactError` naming what is wrong."""
        path = Path(path)
        if path.is_dir():
            path = path / RECORD_NAME
        record = read_json(path, "text pipeline record")
        pipeline = cls.from_record(record, str(path))
        if pipeline.subword == "none":
            return pipeline
        if not isinstance(pipeline.subword_model, str):
            raise ArtifactError(f"{path}: names no {pipeline.subword} model file")
        model = path.parent / pipeline.subword_model
        if not model.is_file():
            raise ArtifactError(f"{model}: missing (the {pipeline.subword} model that {path} "
                                "names)")
        return pipeline.with_model_file(model)

    def normalization_note(self, where: str | os.PathLike) -> str | None:
        """The one line to tell the user when this pipeline (read from ``where``) records no
        Unicode normalization, None otherwise."""
        if self.unicode_normalization is not None:
            return None
        return (f"{where} records no Unicode normalization (written before pipelines "
                "recorded one): text is encoded as typed, so a sentence typed with decomposed "
                "accents (NFD) becomes other tokens than the same sentence in NFC; if the "
                "training text was NFC, add \"unicode_normalization\": \"NFC\" to it")

    @property
    def normalization_form(self) -> str | None:
        """The form :func:`unicodedata.normalize` applies, None for none."""
        form = self.unicode_normalization
        return None if form in (None, "none") else form

    def describe(self) -> str:
        """These settings in a few words, for one log line."""
        steps = []
        if self.normalization_form is not None:
            steps.append(f"Unicode {self.normalization_form}")
        if self.normalize_punctuation:
            steps.append("Moses punctuation normalization")
        if self.lowercase:
            steps.append("lowercasing")
        if self.moses_tokenize:
            options = [name for name, on in (("aggressive dash splits",
                                              self.aggressive_dash_splits),
                                             ("escaping", self.escape)) if on]
            steps.append("Moses tokenization" + (f" ({', '.join(options)})" if options else ""))
        if self.subword != "none":
            steps.append(f"{self.subword} {self.model_path or self.subword_model}")
        return ", ".join(steps) or "whitespace only"

    # -- running --------------------------------------------------------------------------

    def _tool(self, name: str):
        tools = self._tools
        if name not in tools:
            from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

            kind, _, lang = name.partition(":")
            if kind == "normalizer":
                tools[name] = MosesPunctNormalizer(lang=lang, post_remove_control_chars=True)
            elif kind == "tokenizer":
                tools[name] = MosesTokenizer(lang=lang)
            elif kind == "detokenizer":
                tools[name] = MosesDetokenizer(lang=lang)
            elif kind == "bpe":
                tools[name] = read_bpe_codes(self.model_path)
            elif kind == "spm":
                tools[name] = read_sentencepiece(self.model_path)
        return tools[name]

    def open_subword_model(self) -> TextPipeline:
        """Read the subword model now (a malformed file fails here, naming it, rather than at
        the first sentence); returns this pipeline."""
        if self.subword != "none":
            if self.model_path is None:
                raise ArtifactError(f"the {self.subword} model file {self.subword_model} of "
                                    "this text pipeline was not located")
            self._tool("bpe" if self.subword == "bpe" else "spm")
        return self

    def normalize_form(self, text: str) -> str:
        """Step 0: ``text`` in the pipeline's Unicode normalization form."""
        form = self.normalization_form
        return text if form is None else unicodedata.normalize(form, text)

    def pretokenize(self, sentence: str, target: bool = False) -> str:
        """Steps 0-4: a raw sentence of the source (or target) side -> the text the subword
        model learns from and splits (the recipes' ``vaswani-prepare-text normalize`` output)."""
        lang = self.target_lang if target else self.source_lang
        text = single_line(self.normalize_form(sentence))
        if self.normalize_punctuation:
            text = self._tool(f"normalizer:{lang}").normalize(text)
        if self.lowercase:
            text = text.lower()
        if self.moses_tokenize:
            text = self._tool(f"tokenizer:{lang}").tokenize(
                text, aggressive_dash_splits=self.aggressive_dash_splits, escape=self.escape,
                return_str=True)
        return single_line(text)

    def split_subwords(self, text: str) -> str:
        """Step 5 on pretokenized text: space-separated model tokens."""
        if self.subword == "bpe":
            return self._tool("bpe").process_line(text)
        if self.subword == "sentencepiece":
            return " ".join(self._tool("spm").encode(text, out_type=str))
        return text

    def encode(self, sentence: str, target: bool = False) -> str:
        """A raw source (or, with ``target``, target) sentence -> space-separated model
        tokens; never a line break."""
        if self.subword != "none" and self.model_path is None:
            raise ArtifactError(f"the {self.subword} model file {self.subword_model} of this "
                                "text pipeline was not located")
        return single_line(self.split_subwords(self.pretokenize(sentence, target)))

    def encode_lines(self, lines: Iterable[str], target: bool = False) -> Iterator[str]:
        """:meth:`encode` of each line, in order."""
        for line in lines:
            yield self.encode(line, target)

    def decode(self, tokens: str) -> str:
        """Space-separated target model tokens -> a raw target sentence."""
        text = tokens
        if self.subword == "bpe":
            text = (text + " ").replace("@@ ", "").rstrip()
        elif self.subword == "sentencepiece":
            text = "".join(text.split()).replace("\u2581", " ").strip()
        if self.moses_tokenize:
            text = self._tool(f"detokenizer:{self.target_lang}").detokenize(text.split())
        return single_line(self.normalize_form(text))


def find_record(*directories: str | os.PathLike | None) -> Path | None:
    """The first :data:`RECORD_NAME` among ``directories`` (None entries skipped)."""
    for directory in directories:
        if directory is not None and (Path(directory) / RECORD_NAME).is_file():
            return Path(directory) / RECORD_NAME
    return None


def record_mismatch(directory: Path, manifest: Mapping[str, Any],
                    manifest_path: Path) -> str | None:
    """How the text pipeline record of a directory written whole (a model package, an export)
    disagrees with its manifest (``manifest_path``), or None: its language pair, and its
    subword method where the manifest names one. Both are written from the same model, so a
    difference is an edited manifest. Nothing to compare without a record among the files the
    manifest lists, or without a language pair in the manifest."""
    pair = (manifest.get("source_lang"), manifest.get("target_lang"))
    files = manifest.get("files")
    if None in pair or not isinstance(files, Mapping) or RECORD_NAME not in files:
        return None
    pipeline = TextPipeline.load(directory)
    recorded = (pipeline.source_lang, pipeline.target_lang)
    if recorded != pair:
        return (f"{manifest_path}: says {pair[0]}->{pair[1]}, but the {RECORD_NAME} beside it "
                f"is for {recorded[0]}->{recorded[1]}: the manifest was edited")
    subword = manifest.get("subword", pipeline.subword)
    if subword != pipeline.subword:
        return (f"{manifest_path}: says subword {subword!r}, but the {RECORD_NAME} beside it "
                f"says {pipeline.subword!r}: the manifest was edited")
    return None
