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
#: How messages name a directory kind (an export: the value of ``vaswani-export --to``).
TITLES = {"ctranslate2": "CTranslate2 export", "transformers": "transformers export",
          "package": "model package"}
#: The manifest's file name of each kind other than the exports' :data:`MANIFEST`.
MANIFEST_NAMES = {"package": "manifest.json"}


def manifest_name(kind: str) -> str:
    """The manifest's file name in a directory of ``kind``."""
    return MANIFEST_NAMES.get(kind, MANIFEST)


def is_hidden(name: str) -> bool:
    """Whether a file name is hidden (``.name``): such files are never part of a directory of
    ours, so a record that a tool keeps beside the files (the recipes' ``.done``) neither
    enters a manifest nor counts as a foreign file."""
    return name.startswith(".")


def file_records(directory: Path, manifest_name: str = MANIFEST) -> dict[str, dict[str, Any]]:
    """``name -> {"bytes", "sha256"}`` of every file in ``directory`` but the manifest
    ``manifest_name`` and hidden files."""
    return {
        path.name: {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != manifest_name and not is_hidden(path.name)
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
        raise ArtifactError(f"{directory}: no such directory (a {title}: {how})")
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory}: not a {title} of vaswani (no {MANIFEST}; "
                            f"{how})")
    manifest = read_json(path, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != format_name:
        raise ArtifactError(f"{path}: not a manifest of format {format_name}")
    missing = [key for key in ("files", *required) if key not in manifest]
    if missing:
        raise ArtifactError(f"{path}: corrupt manifest (no {missing[0]!r})")
    return manifest


def check_files(directory: Path, manifest: dict, manifest_name: str = MANIFEST,
                what: str = "export") -> None:
    """Check that every file ``manifest`` (read from ``manifest_name``) lists is in
    ``directory`` with its recorded size and sha256, and that nothing else but hidden files is;
    a one-line error names the first file that differs (``what``: how messages name the
    directory's kind)."""
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise ArtifactError(f"{directory / manifest_name}: lists no files")
    mixed = f"the directory is corrupt or mixed with another {what}"
    for name, record in recorded.items():
        path = directory / name
        if (not isinstance(record, dict) or Path(name).name != name or is_hidden(name)
                or type(record.get("bytes")) is not int
                or not isinstance(record.get("sha256"), str)):
            raise ArtifactError(f"{directory / manifest_name}: corrupt manifest (entry {name!r})")
        if not path.is_file():
            raise ArtifactError(f"{path}: missing from the {what} (listed in {manifest_name})")
        size = path.stat().st_size
        if size != record.get("bytes"):
            raise ArtifactError(f"{path}: {size} bytes, but the {what} holds "
                                f"{record.get('bytes')}: {mixed}")
        if sha256_of(path) != record.get("sha256"):
            raise ArtifactError(f"{path}: content differs from the {what}'s (sha256, recorded in "
                                f"{manifest_name}): {mixed}")
    extra = sorted(p.name for p in directory.iterdir()
                   if p.name not in recorded and p.name != manifest_name and not is_hidden(p.name))
    if extra:
        raise ArtifactError(f"{directory / extra[0]}: not part of the {what} (its {manifest_name} "
                            "does not list it: mixed with another model's files?)")


def check_export(directory: str | os.PathLike, format_name: str, kind: str,
                 required: Sequence[str] = ()) -> dict:
    """:func:`read_manifest`, then :func:`check_files`, then the text pipeline record against
    the manifest (:func:`~.text_pipeline.record_mismatch`); returns the manifest."""
    from .text_pipeline import record_mismatch

    manifest = read_manifest(directory, format_name, kind, required)
    check_files(Path(directory), manifest)
    problem = record_mismatch(Path(directory), manifest, Path(directory) / MANIFEST)
    if problem is not None:
        raise ArtifactError(problem)
    return manifest
