"""The layout of a Hugging Face transformers export of ours, and its exact tokenization route.

The directory is what ``from_pretrained`` reads (``config.json``, ``model.safetensors``,
``generation_config.json`` and a tokenizer's files), plus:

* :data:`~.text_pipeline.RECORD_NAME` and the subword model it names: the text pipeline the model
  was trained with;
* :data:`SOURCE_VOCAB` and :data:`TARGET_VOCAB`: our token -> id maps (fairseq's dictionary
  indices, which are the model's ids);
* :data:`MANIFEST`: the model class, the language pair, the tokenizer class, and the size and
  sha256 of every file (checked by :func:`check_transformers_export`).

The exact tokenization route (:func:`source_ids`) is the text pipeline, then the vocabulary, then
EOS: the ids our model is fed, for BPE and SentencePiece models alike. The shipped tokenizer
(``AutoTokenizer.from_pretrained``) needs no code of ours: ``MarianTokenizer`` for SentencePiece
models, ``FSMTTokenizer`` for BPE models; docs/export.md measures how often its ids agree.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import manifest
from .errors import ArtifactError, read_json
from .text_pipeline import TextPipeline

#: The format name of a transformers export's manifest.
FORMAT = "vaswani-transformers/1"
#: Our token -> id maps (JSON objects).
SOURCE_VOCAB = "vaswani_source_vocab.json"
TARGET_VOCAB = "vaswani_target_vocab.json"
#: fairseq's special symbols (the ids every export keeps).
BOS, PAD, EOS, UNK = 0, 1, 2, 3


def hide_unloadable_torchaudio() -> None:
    """transformers imports torchaudio whenever it is installed (for audio features that a
    translation model never uses). A torchaudio built for another torch version fails to load
    and would stop that import; such a torchaudio is hidden from this process."""
    if "torchaudio" in sys.modules or importlib.util.find_spec("torchaudio") is None:
        return
    try:
        import torchaudio  # noqa: F401
    except (OSError, ImportError, RuntimeError):
        sys.modules["torchaudio"] = None  # type: ignore[assignment]


def require_transformers():
    """The ``transformers`` module, or a one-line error saying how to install it."""
    hide_unloadable_torchaudio()
    try:
        import transformers
    except ImportError:
        raise ArtifactError("Hugging Face transformers is not installed: pip install "
                            "'transformers>=5,<6' (or the project's extra: pip install -e "
                            "'.[transformers]')") from None
    transformers.utils.logging.set_verbosity_error()  # stderr keeps to errors, as ours does
    transformers.utils.logging.disable_progress_bar()
    return transformers


def check_transformers_export(directory: str | os.PathLike) -> dict:
    """The manifest of a transformers export, after checking every file it lists by size and
    sha256 and that nothing else is there; a one-line error names the first file that differs."""
    return manifest.check_export(directory, FORMAT, "transformers")


class ExportTokenizer:
    """The exact tokenization route of a transformers export: raw text -> the ids our model is
    fed (text pipeline, vocabulary, EOS), and target ids -> raw text."""

    def __init__(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        check_transformers_export(directory)
        self.pipeline = TextPipeline.load(directory)
        self.source_vocab: dict[str, int] = read_json(directory / SOURCE_VOCAB, "vocabulary")
        target_vocab: dict[str, int] = read_json(directory / TARGET_VOCAB, "vocabulary")
        self.target_symbols = {index: token for token, index in target_vocab.items()}

    def source_ids(self, sentence: str) -> list[int]:
        """A raw source sentence -> its ids, EOS last (as fairseq feeds the encoder)."""
        tokens = self.pipeline.encode(sentence).split()
        return [self.source_vocab.get(token, UNK) for token in tokens] + [EOS]

    def batch(self, sentences: Sequence[str]) -> dict:
        """Right-padded ``input_ids`` and ``attention_mask`` tensors of raw sentences, what
        ``model.generate(**batch)`` takes."""
        import torch

        rows = [self.source_ids(sentence) for sentence in sentences]
        width = max(len(row) for row in rows)
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return {"input_ids": ids, "attention_mask": ids.ne(PAD).long()}

    def decode(self, ids: Sequence[int]) -> str:
        """Generated target ids -> a raw target sentence (special symbols dropped)."""
        tokens = [self.target_symbols.get(int(i), "<unk>") for i in ids
                  if int(i) not in (BOS, PAD, EOS)]
        return self.pipeline.decode(" ".join(tokens))
