"""A text pipeline given by its files rather than by a record: :class:`TextCodec`."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.digests import sha256_of
from ..artifacts.errors import ArtifactError
from ..artifacts.text_pipeline import DEFAULT_NORMALIZATION, TextPipeline


class TextCodec(TextPipeline):
    """The :class:`~user_plugin.artifacts.text_pipeline.TextPipeline` of NFC, Moses
    tokenization (when ``moses``; no punctuation normalization, no dash splitting, no escaping)
    and the subword model given (subword-nmt codes or a SentencePiece model), for text prepared that
    way by hand. Models trained by the recipes carry their own record instead."""

    def __init__(self, source_lang: str, target_lang: str, moses: bool,
                 bpe_codes: Path | None = None,
                 sentencepiece_model: Path | None = None) -> None:
        if bpe_codes is not None and sentencepiece_model is not None:
            raise ArtifactError("give either BPE codes or a SentencePiece model, not both")
        subword = ("bpe" if bpe_codes is not None else
                   "sentencepiece" if sentencepiece_model is not None else "none")
        super().__init__(source_lang, target_lang, unicode_normalization=DEFAULT_NORMALIZATION,
                         normalize_punctuation=False,
                         moses_tokenize=moses, aggressive_dash_splits=False, subword=subword)
        given = bpe_codes if bpe_codes is not None else sentencepiece_model
        if given is not None:
            given = Path(given)
            if not given.is_file():
                raise ArtifactError(f"{given}: no such {subword} model file")
            self.subword_model, self.model_path = given.name, given
            self.subword_model_sha256 = sha256_of(given)
            self.open_subword_model()
