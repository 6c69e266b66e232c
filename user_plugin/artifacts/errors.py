"""The one error type of trained-model files: a checkpoint, model directory, text pipeline record
or export that cannot be used or written."""

from __future__ import annotations

from ..files.errors import UserError


class ArtifactError(UserError, RuntimeError):
    """A trained-model file (checkpoint, dictionary, subword model, pipeline record, export)
    that cannot be used, or an export that cannot be written; the message is one line naming
    the file and the reason. A :class:`~user_plugin.files.errors.UserError` (command lines
    report it as one line) and a ``RuntimeError``."""
