"""Writing a directory of ours whole (an export, a model package): staged beside the output,
described by its manifest (:mod:`user_plugin.artifacts.manifest`), checked, then moved into
place.

Such a directory is written into a temporary directory next to ``--output`` (same file system), the
manifest records every file's size and sha256, the directory is checked as a reader would check
it, and only then replaces the output. An existing output is replaced only when it is one of our
exports (or empty), so a user's other directory is never overwritten, and a failure at any step
leaves the previous export as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..files.atomic import atomic_write_text, make_temp_dir
from ..files.errors import file_error, note_written, os_error_of
from .errors import ArtifactError
from .manifest import TITLES, file_records, is_hidden, manifest_name


@dataclass(frozen=True)
class ExportedDirectory:
    """What a directory exporter (CTranslate2, transformers) wrote: the directory, its manifest,
    and one line saying what it holds and how to use it."""

    directory: Path
    manifest: dict
    summary: str


def refuse_foreign_output(output: Path, kind: str) -> None:
    """A one-line error when ``output`` exists and is neither empty nor an export of ours
    (``kind`` is the value of ``--to``), or when it is an export of ours that holds anything
    its manifest does not list (a file the user put there, such as the checkpoint it was
    exported from): replacing the export would delete it."""
    manifest = manifest_name(kind)
    if output.exists() and (not output.is_dir() or (
            any(output.iterdir()) and not (output / manifest).is_file())):
        raise ArtifactError(f"{output}: exists and is not a {TITLES.get(kind, kind)} of "
                            "vaswani; remove it or choose another --output")
    if output.is_dir() and (output / manifest).is_file():
        foreign = sorted(name for name in set(os.listdir(output))
                         - set(listed_files(output, kind)) - {manifest} if not is_hidden(name))
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise ArtifactError(f"{output}: holds {output / foreign[0]}{more}, which is not "
                                "part of the export (its manifest does not list it): replacing "
                                "the export would delete it; move it out or choose another "
                                "--output (nothing was written)")


def listed_files(directory: Path, kind: str) -> list[str]:
    """The file names the manifest of ``directory``, of ``kind``, lists (none when it cannot be
    read: then nothing in the directory counts as the export's)."""
    try:
        manifest = json.loads((directory / manifest_name(kind)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return [name for name in files if isinstance(name, str)] if isinstance(files, dict) else []


def replace_directory(new: Path, output: Path, kind: str) -> None:
    """Move the complete directory ``new`` to ``output``. An existing ``output`` (checked again,
    as it may have changed while the export ran) is renamed aside first and removed last, so a
    complete export is always there under one of the two names."""
    refuse_foreign_output(output, kind)
    if output.exists():
        old = make_temp_dir(output)
        os.replace(output, old / "previous")
        os.replace(new, output)
        shutil.rmtree(old)
    else:
        os.replace(new, output)
    note_written(output)


def write_export(output: Path, kind: str, manifest: dict, fill: Callable[[Path], None],
                 check: Callable[[Path], dict]) -> None:
    """Write the export ``output``: ``fill(directory)`` writes the files into a new empty
    directory (and may add to ``manifest``), then the manifest gets every file's record, the
    directory is checked by ``check`` and moved into place. One-line errors; on any failure
    nothing is left behind and ``output`` is unchanged. (Callers refuse a foreign ``output``
    before their own work; :func:`replace_directory` checks it again at the end.)"""
    staging = make_temp_dir(output)
    try:
        directory = staging / "model"
        directory.mkdir()
        fill(directory)
        manifest["files"] = file_records(directory, manifest_name(kind))
        atomic_write_text(directory / manifest_name(kind),
                          json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        check(directory)
        replace_directory(directory, output, kind)
    except Exception as error:  # a full disk in a library's writer (safetensors...) too
        reason = os_error_of(error)
        if reason is None:
            raise
        raise file_error(output, reason, writing=True) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
