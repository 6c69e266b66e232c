"""Raw text <-> the model's token strings: Moses tokenization (sacremoses) and subword units
(subword-nmt BPE codes or a SentencePiece model)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from ..files.errors import first_line
from ..files.text import single_line
from .errors import HubError


def read_bpe_codes(path: Path):
    """subword-nmt's ``BPE`` of the codes file ``path``, or a :class:`HubError` naming the file.

    subword-nmt reports a malformed line on stderr and calls ``sys.exit(1)``; its message is
    caught and becomes the error's reason. The file is read by the project's line rule (only
    LF ends a line).
    """
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
    raise HubError(f"cannot read BPE codes {path}: {reason}")


class TextCodec:
    """Raw text <-> the model's token strings: Moses (sacremoses) and subword-nmt/SentencePiece.

    Encoding: whitespace made single spaces (:func:`~user_plugin.files.text.single_line`, as
    the data preparation does), sacremoses ``tokenize`` (no escaping) when ``moses``, then BPE
    or SentencePiece. Decoding: BPE or SentencePiece removal, then sacremoses ``detokenize`` in
    the target language. Neither direction ever returns a line break of any kind (CR, NEL,
    U+2028...), so one sentence stays one line.
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
            self.bpe = read_bpe_codes(bpe_codes)
        if sentencepiece_model is not None:
            import sentencepiece

            try:
                self.spm = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model))
            except (OSError, RuntimeError) as exc:
                raise HubError(
                    f"cannot read SentencePiece model {sentencepiece_model}: {first_line(exc)}"
                ) from None

    def encode(self, sentence: str, target: bool = False) -> str:
        """Raw source (or, with ``target``, target) sentence -> space-separated model tokens."""
        text = single_line(sentence)
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
        return single_line(text)
