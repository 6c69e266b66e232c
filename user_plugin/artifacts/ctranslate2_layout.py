"""The layout of a CTranslate2 export directory of ours: CTranslate2's files, the subword model,
the text pipeline record and a manifest (:data:`MANIFEST`) with the language pair, the position
limits, the paper's decoding settings and the size and sha256 of every file, so that a corrupt or
mixed directory is recognised before translating (:func:`check_export_directory`)."""

from __future__ import annotations

import os
from typing import Any

from . import manifest
from .errors import ArtifactError

#: The manifest's format name; a directory without it is not one of our exports.
FORMAT = "vaswani-ctranslate2/1"
#: What a manifest must hold besides its format and files.
MANIFEST_KEYS = ("source_lang", "target_lang", "moses", "bpe_codes", "sentencepiece_model",
                 "max_source_positions", "max_target_positions")
#: CTranslate2's name for fairseq's padding symbol (what its fairseq converter uses).
CT2_PAD = "<blank>"


def require_ctranslate2():
    """The ``ctranslate2`` module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ArtifactError("CTranslate2 is not installed: pip install 'ctranslate2==4.8.5' "
                        "(or the project's extra: pip install -e '.[ctranslate2]')") from None
    return ctranslate2


def ctranslate2_vocabulary(dictionary: Any) -> list[str]:
    """A fairseq dictionary's symbols in CTranslate2's convention (padding is ``<blank>``)."""
    return [CT2_PAD if symbol == "<pad>" else symbol for symbol in dictionary.symbols]


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of a CTranslate2 export directory; a one-line error when there is none or
    it is not ours."""
    return manifest.read_manifest(directory, FORMAT, "ctranslate2", MANIFEST_KEYS)


def check_export_directory(directory: str | os.PathLike) -> dict:
    """The manifest of ``directory``, after checking every file it lists by size and sha256 and
    that nothing else is there; a one-line error names the first file that differs."""
    return manifest.check_export(directory, FORMAT, "ctranslate2", MANIFEST_KEYS)
