"""The layout of a CTranslate2 export directory of ours: CTranslate2's files, the subword model,
the text pipeline record and a manifest (:data:`MANIFEST`) with the language pair, the position
limits, the paper's decoding settings and the size and sha256 of every file, so that a corrupt or
mixed directory is recognised before translating (:func:`check_export_directory`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .digests import sha256_of
from .errors import ArtifactError, read_json

#: The file of an export directory that describes it (see the module docstring).
MANIFEST = "vaswani_export.json"
#: The manifest's format name; a directory without it is not one of our exports.
FORMAT = "vaswani-ctranslate2/1"
#: What a manifest must hold besides its format.
MANIFEST_KEYS = ("source_lang", "target_lang", "moses", "bpe_codes", "sentencepiece_model",
                 "max_source_positions", "max_target_positions", "files")
#: Names the subword model gets in the directory (the hub looks for these first).
BPE_CODES_NAME = "bpecodes"
SENTENCEPIECE_NAME = "sentencepiece.bpe.model"
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


def file_records(directory: Path) -> dict[str, dict[str, Any]]:
    """``name -> {"bytes", "sha256"}`` of every file in ``directory`` but the manifest."""
    return {
        path.name: {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(directory.iterdir()) if path.is_file() and path.name != MANIFEST
    }


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of an export directory; a one-line error when there is none or it is not
    ours."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: no such directory (a CTranslate2 export of "
                        "python -m user_plugin.export --to ctranslate2)")
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory}: not a CTranslate2 export of vaswani (no {MANIFEST}; "
                        "export one with python -m user_plugin.export ... --to ctranslate2)")
    manifest = read_json(path, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a manifest of format {FORMAT}")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise ArtifactError(f"{path}: corrupt manifest (no {missing[0]!r})")
    return manifest


def check_export_directory(directory: str | os.PathLike) -> dict:
    """Read the manifest of ``directory`` and check that every file it lists is there with its
    recorded size and sha256, and that nothing else is; returns the manifest. A one-line error
    names the first file that differs (a corrupt or partly replaced directory)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise ArtifactError(f"{directory / MANIFEST}: lists no files")
    for name, record in recorded.items():
        path = directory / name
        if not isinstance(record, dict):
            raise ArtifactError(f"{directory / MANIFEST}: corrupt manifest (entry {name!r})")
        if not path.is_file():
            raise ArtifactError(f"{path}: missing from the export (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != record.get("bytes"):
            raise ArtifactError(f"{path}: {size} bytes, but the export wrote "
                                f"{record.get('bytes')}: "
                                "the directory is corrupt or mixed with another export")
        if sha256_of(path) != record.get("sha256"):
            raise ArtifactError(f"{path}: content differs from the export (sha256): the directory "
                            "is corrupt or mixed with another export")
    extra = sorted(p.name for p in directory.iterdir() if p.name not in recorded
                   and p.name != MANIFEST)
    if extra:
        raise ArtifactError(f"{directory / extra[0]}: not part of the export (mixed with another "
                        "model's files?)")
    return manifest
