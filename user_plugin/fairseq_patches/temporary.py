"""Replacing an attribute for the length of one call, and no longer.

Some rows change what fairseq looks up only while one of its functions runs for one of our
runs: the ``PathManager`` of a checkpoint save, the line reader of ``fairseq-interactive``, the
progress bars of a training loop, the optimizer class a trainer builds, ``Tensor.cuda`` in a
CPU float16 step. :func:`replaced` is that one mechanism: the attribute is fairseq's own again
as soon as the call ends, however it ends.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Within the block, ``owner.name`` (or ``owner[name]`` for a dict, such as a function's
    module globals) is ``value``; the previous object is put back afterwards (the very same
    object)."""
    if isinstance(owner, dict):
        previous = owner[name]
        owner[name] = value
        try:
            yield
        finally:
            owner[name] = previous
        return
    # a class may inherit the attribute: then removing ours brings the inherited one back
    own = not isinstance(owner, type) or name in vars(owner)
    previous = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, previous)
        else:
            delattr(owner, name)
