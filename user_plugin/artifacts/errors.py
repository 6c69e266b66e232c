"""The one error type of trained-model files: a checkpoint, model directory, text pipeline record
or export that cannot be used or written."""

from __future__ import annotations

import json
import os

from ..files.errors import UserError, file_error


class ArtifactError(UserError, RuntimeError):
    """A trained-model file (checkpoint, dictionary, subword model, pipeline record, export)
    that cannot be used, or an export that cannot be written; the message is one line naming
    the file and the reason. A :class:`~user_plugin.files.errors.UserError` (command lines
    report it as one line) and a ``RuntimeError``."""


def read_json(path: str | os.PathLike, what: str) -> object:
    """The JSON document in ``path``; one-line errors: the file's own (missing, unreadable, not
    UTF-8), or an :class:`ArtifactError` ``PATH: corrupt WHAT (not JSON: ... at line N)``."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError) as error:
        raise file_error(path, error) from None
    except json.JSONDecodeError as error:
        raise ArtifactError(f"{path}: corrupt {what} (not JSON: {error.msg} at line "
                            f"{error.lineno})") from None
