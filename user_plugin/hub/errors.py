"""The hub's error: a model directory, checkpoint or option that cannot be used."""

from __future__ import annotations

from ..files.errors import UserError


class HubError(UserError, RuntimeError):
    """A model directory, checkpoint or text-processing file that cannot be used; the message
    is one line that names the file. A :class:`~user_plugin.files.errors.UserError` (so
    command lines report it as one line) and a ``RuntimeError``."""
