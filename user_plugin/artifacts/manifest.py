"""The manifest of an export directory of ours: one JSON file (:data:`MANIFEST`) that names the
export's format and records the size and sha256 of every other file in the directory.

Every export (CTranslate2, transformers) writes one, and every reader checks the directory
against it before use, so that a corrupt, partly replaced or mixed directory is refused in one
line instead of translating with the wrong files. Identity is the content (sha256); the size is
checked first because it is cheap and names the most common corruption, a truncated copy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from .digests import sha256_of
from .errors import ArtifactError, read_json

#: The file of an export directory that describes it.
MANIFEST = "vaswani_export.json"
#: How messages name an export kind (the value of ``vaswani-export --to``).
TITLES = {"ctranslate2": "CTranslate2", "transformers": "transformers"}


def file_records(directory: Path) -> dict[str, dict[str, Any]]:
    """``name -> {"bytes", "sha256"}`` of every file in ``directory`` but the manifest."""
    return {
        path.name: {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(directory.iterdir()) if path.is_file() and path.name != MANIFEST
    }


def read_manifest(directory: str | os.PathLike, format_name: str, kind: str,
                  required: Sequence[str] = ()) -> dict:
    """The manifest of ``directory``, an export of ``kind`` (``"ctranslate2"``,
    ``"transformers"``) in format ``format_name`` holding the keys ``required``; a one-line
    error when the directory, the manifest or a key is missing, or the format differs."""
    directory = Path(directory)
    title = TITLES.get(kind, kind)
    how = f"export one with vaswani-export ... --to {kind}"
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: no such directory (a {title} export: {how})")
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory}: not a {title} export of vaswani (no {MANIFEST}; "
                            f"{how})")
    manifest = read_json(path, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != format_name:
        raise ArtifactError(f"{path}: not a manifest of format {format_name}")
    missing = [key for key in ("files", *required) if key not in manifest]
    if missing:
        raise ArtifactError(f"{path}: corrupt manifest (no {missing[0]!r})")
    return manifest


def check_files(directory: Path, manifest: dict) -> None:
    """Check that every file ``manifest`` lists is in ``directory`` with its recorded size and
    sha256, and that nothing else is; a one-line error names the first file that differs."""
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise ArtifactError(f"{directory / MANIFEST}: lists no files")
    mixed = "the directory is corrupt or mixed with another export"
    for name, record in recorded.items():
        path = directory / name
        if not isinstance(record, dict):
            raise ArtifactError(f"{directory / MANIFEST}: corrupt manifest (entry {name!r})")
        if not path.is_file():
            raise ArtifactError(f"{path}: missing from the export (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != record.get("bytes"):
            raise ArtifactError(f"{path}: {size} bytes, but the export wrote "
                                f"{record.get('bytes')}: {mixed}")
        if sha256_of(path) != record.get("sha256"):
            raise ArtifactError(f"{path}: content differs from the export (sha256): {mixed}")
    extra = sorted(p.name for p in directory.iterdir()
                   if p.name not in recorded and p.name != MANIFEST)
    if extra:
        raise ArtifactError(f"{directory / extra[0]}: not part of the export (mixed with another "
                            "model's files?)")


def check_export(directory: str | os.PathLike, format_name: str, kind: str,
                 required: Sequence[str] = ()) -> dict:
    """:func:`read_manifest`, then :func:`check_files`; returns the manifest."""
    manifest = read_manifest(directory, format_name, kind, required)
    check_files(Path(directory), manifest)
    return manifest
