"""Raw text <-> the model's token strings: Moses tokenization (sacremoses) and subword units
(subword-nmt BPE codes or a SentencePiece model)."""

from __future__ import annotations

from pathlib import Path

from .errors import HubError


class TextCodec:
    """Raw text <-> the model's token strings: Moses (sacremoses) and subword-nmt/SentencePiece.

    Encoding: sacremoses ``tokenize`` (no escaping) when ``moses``, then BPE or SentencePiece.
    Decoding: BPE or SentencePiece removal, then sacremoses ``detokenize`` in the target language.
    """

    def __init__(
        self,
        source_lang: str,
        target_lang: str,
        moses: bool,
        bpe_codes: Path | None = None,
        sentencepiece_model: Path | None = None,
    ) -> None:
        if bpe_codes is not None and sentencepiece_model is not None:
            raise HubError("give either BPE codes or a SentencePiece model, not both")
        self.tokenizer = self.target_tokenizer = self.detokenizer = None
        if moses:
            from sacremoses import MosesDetokenizer, MosesTokenizer

            self.tokenizer = MosesTokenizer(lang=source_lang)
            self.target_tokenizer = MosesTokenizer(lang=target_lang)
            self.detokenizer = MosesDetokenizer(lang=target_lang)
        self.bpe = self.spm = None
        if bpe_codes is not None:
            from subword_nmt.apply_bpe import BPE

            try:
                with open(bpe_codes, encoding="utf-8") as codes:
                    self.bpe = BPE(codes)
            except (OSError, ValueError, IndexError) as exc:
                raise HubError(f"cannot read BPE codes {bpe_codes}: {exc}") from None
        if sentencepiece_model is not None:
            import sentencepiece

            try:
                self.spm = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model))
            except (OSError, RuntimeError) as exc:
                raise HubError(
                    f"cannot read SentencePiece model {sentencepiece_model}: {exc}"
                ) from None

    def encode(self, sentence: str, target: bool = False) -> str:
        """Raw source (or, with ``target``, target) sentence -> space-separated model tokens."""
        text = sentence.strip()
        tokenizer = self.target_tokenizer if target else self.tokenizer
        if tokenizer is not None:
            text = tokenizer.tokenize(text, escape=False, return_str=True)
        if self.bpe is not None:
            text = self.bpe.process_line(text)
        if self.spm is not None:
            text = " ".join(self.spm.encode(text, out_type=str))
        return text

    def decode(self, tokens: str) -> str:
        """Space-separated model tokens -> raw target sentence."""
        text = tokens
        if self.bpe is not None:
            text = (text + " ").replace("@@ ", "").rstrip()
        if self.spm is not None:
            text = "".join(text.split()).replace("\u2581", " ").strip()
        if self.detokenizer is not None:
            text = self.detokenizer.detokenize(text.split())
        return text
