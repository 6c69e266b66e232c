"""The model a server translates with: loaded once through the hub, with the fingerprint that
says by content what is served, and the two things the routes ask of it (translations of a
batch of sentences, the encoder-decoder attention of one).

Translations come from the hub's :meth:`~user_plugin.hub.translator.TextTranslator.translate`
itself, so the server's outputs are ``vaswani-translate``'s on the same model: the same text
pipeline, the paper's decoding (beam search, GNMT penalty, source + 50 tokens), and the hub's
batching (sentences sorted by length, ``batch_size`` at a time).

The **model fingerprint** is the sha256 of what decides the outputs: for the fairseq backend the
sha256 of each checkpoint file, the training fingerprint (languages and the dictionaries' token
order, :mod:`user_plugin.artifacts.fingerprint`) and the text pipeline record (with its subword
model's sha256); for the ctranslate2 backend the sha256 of every file of the export (its
manifest's records) and the text pipeline record. Two servers with the same fingerprint
translate alike; renaming or copying a model keeps it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..files.errors import InvalidValue
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE

#: The backends, as ``vaswani-translate --backend`` names them.
BACKENDS = ("fairseq", "ctranslate2")


class NotSupported(Exception):
    """What the served backend cannot do at all (not a fault of the request's values)."""


@dataclass(frozen=True)
class DecodingOptions:
    """How a request's sentences are decoded; requests with equal ``beam`` and ``nbest`` share
    a batch, each sentence with its own ``lenpen``."""

    beam: int = BEAM
    lenpen: float = LENPEN
    nbest: int = 1


@dataclass(frozen=True)
class ModelSettings:
    """Where the model is and how to load it (``vaswani-translate``'s options of the same
    names); ``threads`` is torch's intra-op threads (fairseq) or CTranslate2's
    ``intra_threads``, 0 for the library's default; ``device`` is where the model runs
    (``cpu``, ``cuda``, ``cuda:N``), for both backends."""

    model_dir: Path
    backend: str = "fairseq"
    checkpoints: tuple[str, ...] | None = None
    data_dir: Path | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    bpe_codes: Path | None = None
    sentencepiece_model: Path | None = None
    beam: int = BEAM
    lenpen: float = LENPEN
    batch_size: int = 64
    threads: int = 0
    device: str = "cpu"


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False)
                          .encode("utf-8")).hexdigest()


class ServedModel:
    """A loaded translator (:func:`load`), its fingerprint and description."""

    def __init__(self, translator, settings: ModelSettings, identity: dict) -> None:
        self.translator = translator
        self.settings = settings
        self.identity = identity
        self.fingerprint = _digest(identity)

    @classmethod
    def load(cls, settings: ModelSettings) -> ServedModel:
        """Load ``settings``' model through the hub; a one-line
        :class:`~user_plugin.artifacts.errors.ArtifactError` for files that cannot be used."""
        if settings.backend == "ctranslate2":
            return cls._load_ctranslate2(settings)
        return cls._load_fairseq(settings)

    @classmethod
    def _load_fairseq(cls, settings: ModelSettings) -> ServedModel:
        import torch

        from ..artifacts.fingerprint import task_fingerprint
        from ..hub import load_translator

        if settings.threads:
            torch.set_num_threads(settings.threads)
        translator = load_translator(
            settings.model_dir, checkpoints=settings.checkpoints, data_dir=settings.data_dir,
            source_lang=settings.source_lang, target_lang=settings.target_lang,
            bpe_codes=settings.bpe_codes, sentencepiece_model=settings.sentencepiece_model,
            beam=settings.beam, lenpen=settings.lenpen, batch_size=settings.batch_size,
            device=settings.device,
        )
        files = translator.model_files
        identity = {
            "backend": "fairseq",
            "checkpoints": files.checkpoint_sha256(),
            "training_data": task_fingerprint(translator.task),
            "text_pipeline": translator.codec.record(),
        }
        return cls(translator, settings, identity)

    @classmethod
    def _load_ctranslate2(cls, settings: ModelSettings) -> ServedModel:
        from ..hub.ctranslate2_translator import CTranslate2Translator, open_export

        engine, codec, manifest = open_export(
            settings.model_dir, settings.source_lang, settings.target_lang, settings.bpe_codes,
            settings.sentencepiece_model, threads=settings.threads, device=settings.device)
        translator = CTranslate2Translator(engine, codec, manifest, beam=settings.beam,
                                           lenpen=settings.lenpen,
                                           batch_size=settings.batch_size)
        identity = {
            "backend": "ctranslate2",
            "export": {name: record["sha256"] for name, record in manifest["files"].items()},
            "text_pipeline": codec.record(),
        }
        return cls(translator, settings, identity)

    @property
    def backend(self) -> str:
        return self.identity["backend"]

    @property
    def has_attention(self) -> bool:
        """Whether :meth:`attention` can answer: the fairseq backend runs the model in torch,
        whose every layer and head can be read; CTranslate2 returns no per-head weights."""
        return self.backend == "fairseq"

    def describe(self) -> dict:
        """What is served, for ``GET /model``."""
        codec = self.translator.codec
        return {
            "fingerprint": self.fingerprint,
            "backend": self.backend,
            "model_dir": os.fspath(self.settings.model_dir),
            "source_lang": codec.source_lang,
            "target_lang": codec.target_lang,
            "text_pipeline": {"steps": codec.describe(), **codec.record()},
            "decoding": {"beam": self.settings.beam, "lenpen": self.settings.lenpen,
                         "length_penalty": "gnmt",
                         "max_length": f"source tokens + {MAX_LEN_OVER_SOURCE}"},
            "attention": self.has_attention,
            "identity": self.identity,
        }

    def translate(self, sentences: list[str], options: DecodingOptions,
                  lenpens: list[float] | None = None) -> list:
        """The hub's translations of ``sentences``: one string per sentence, or one list of
        ``nbest`` strings when ``options.nbest`` > 1, each sentence decoded with its alpha in
        ``lenpens`` (default: ``options.lenpen``); a ``ValueError`` (a sentence longer than
        the model's positions, a decoding option the backend refuses) or a
        :class:`~user_plugin.files.UserError` before anything is decoded."""
        return self.translator.translate(list(sentences), nbest=options.nbest,
                                         beam=options.beam,
                                         lenpen=options.lenpen if lenpens is None else lenpens)

    def length_problem(self, sentences) -> str | None:
        """Why the model cannot take one of ``sentences`` (longer than its source positions),
        or None: the text pipeline and a count, no decoding."""
        return self.translator.length_problem(list(sentences))

    def attention(self, sentence: str, options: DecodingOptions) -> dict:
        """The best translation of ``sentence`` and its encoder-decoder attention,
        teacher-forced on that translation (:mod:`user_plugin.modules.attention_maps`; the
        first model of an ensemble): ``translation``, ``source_tokens`` (the columns, ending
        with ``</s>``), ``target_tokens`` (the rows: each predicted token, ending with
        ``</s>``), ``layers``, ``heads`` and ``weights[layer][head][row][column]`` (each row
        sums to 1, rounded to 4 decimals)."""
        from ..modules.attention_maps import MAX_DRAWN_TOKENS, attention_maps

        if not self.has_attention:
            raise NotSupported("the ctranslate2 backend returns no per-layer, per-head "
                               "attention: serve the checkpoint (--backend fairseq) to see it")
        translator = self.translator
        encoded = translator.model_tokens([sentence])[0]  # what the hub feeds the model
        if not encoded.strip():
            raise InvalidValue("text: empty sentence (nothing to attend to)")
        tokens = len(encoded.split()) + 1  # with EOS
        if tokens > MAX_DRAWN_TOKENS:
            raise InvalidValue(f"text: {tokens} model tokens (with EOS), more than the "
                               f"{MAX_DRAWN_TOKENS} whose attention is drawn: give a shorter "
                               "sentence (POST /translate takes it)")
        hypothesis = translator.translate_tokens([encoded], beam=options.beam,
                                                 lenpen=options.lenpen)[0][0]
        src_dict = translator.task.source_dictionary
        tgt_dict = translator.task.target_dictionary
        src_tokens = src_dict.encode_line(encoded, add_if_not_exist=False).long()
        tgt_tokens = tgt_dict.encode_line(hypothesis["tokens"], add_if_not_exist=False).long()
        maps = attention_maps(translator.models[0], src_tokens, tgt_tokens, tgt_dict.eos())
        weights = [layer.double().round(decimals=4).tolist() for layer in maps["encoder_decoder"]]
        return {
            "translation": translator.codec.decode(hypothesis["tokens"]),
            "source_tokens": [src_dict[i] for i in src_tokens.tolist()],
            "target_tokens": [tgt_dict[i] for i in tgt_tokens.tolist()],
            "layers": len(weights),
            "heads": len(weights[0]) if weights else 0,
            "weights": weights,
        }
