"""Content identity of files: the sha256 that records and manifests compare."""

from __future__ import annotations

import hashlib
import os

from ..files.errors import file_error


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 of a file, read in 1 MiB blocks; a one-line error when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise file_error(path, error) from None
    return digest.hexdigest()
