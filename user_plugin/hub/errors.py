"""The hub's error: the one error type of trained-model files
(:class:`~user_plugin.artifacts.errors.ArtifactError`), under the name the hub's users know."""

from __future__ import annotations

from ..artifacts.errors import ArtifactError

#: A model directory, checkpoint, text-processing file or option that cannot be used; one line
#: naming the file.
HubError = ArtifactError
