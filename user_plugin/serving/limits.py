"""What one ``vaswani-serve`` process accepts: the bounds that keep a burst of clients, or one
large client, from making every other client wait without end.

Each bound has its answer (docs/serving.md): a body over :attr:`Limits.max_body_bytes` or a
request of more than :attr:`Limits.max_sentences` sentences is 413; a request that would make
the queue hold more than :attr:`Limits.max_queue` sentences waiting to be decoded is 503 with
``Retry-After``; a request not answered :attr:`Limits.deadline` seconds after it arrived is 504
(408 when its body has not even arrived by then); a ``beam`` above :attr:`Limits.max_beam` is
422.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..files.errors import UserError


@dataclass(frozen=True)
class Limits:
    """The bounds of one server (the command's flags of the same names)."""

    #: Largest request body, in bytes.
    max_body_bytes: int = 1 << 20
    #: Most sentences in one request.
    max_sentences: int = 256
    #: Most sentences waiting for the decoder (accepted, not yet being decoded).
    max_queue: int = 1024
    #: Seconds from a request's arrival to its answer.
    deadline: float = 30.0
    #: Largest beam a request may ask for.
    max_beam: int = 16
    #: Most sentences decoded in one call of the decoder (one batch; ``vaswani-serve`` makes it
    #: its ``--batch-size``, the hub's batch, so that a batch is never several in a row).
    max_batch: int = 64
    #: Seconds the idle decoder waits after a first request for others to join its batch.
    batch_wait: float = 0.005

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_sentences", "max_queue", "max_beam", "max_batch"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("deadline", "batch_wait"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "deadline" and value == 0):
                raise UserError(f"{name} must be a finite number of seconds "
                                f"{'above' if name == 'deadline' else 'at least'} 0, "
                                f"got {value}")
        if self.max_sentences > self.max_queue:
            raise UserError(f"max_sentences ({self.max_sentences}) is more than the queue holds "
                            f"(max_queue {self.max_queue}): such a request could never be "
                            "accepted")
