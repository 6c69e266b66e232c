"""The project's file chores, in one place for the plugin and every script.

* :mod:`.errors`: :class:`UserError` (bad input or files, reported as one line),
  :func:`first_line`, :func:`run_main` (``prog: error: ...`` and exit status 1) and
  :func:`file_error` (an ``OSError``/``UnicodeDecodeError`` about a path as one line);
* :mod:`.atomic`: :func:`atomic_write`, :func:`atomic_write_text`, :func:`atomic_copy` (a
  temporary file beside the destination, then ``os.replace``) and the temporary files' names;
* :mod:`.text`: :func:`read_lines` and :func:`iter_lines` of UTF-8 text files;
* :mod:`.checkpoints`: :func:`read_checkpoint` of fairseq checkpoints,
  :func:`checkpoint_file_problem`, :data:`LOAD_ERRORS`, :class:`CheckpointError`.

Importing this package needs neither torch nor fairseq (reading a checkpoint imports them).
fairseq sets up logging at INFO and logs a line when it is first imported, unless logging is
set up before; a script therefore calls ``logging.basicConfig(level=logging.WARNING, ...)``
first, so that its stderr holds nothing but its own messages (one line for an error).
"""

from .atomic import (
    TEMP_SUFFIX,
    atomic_copy,
    atomic_write,
    atomic_write_text,
    make_temp_dir,
    temp_destination,
    temp_name_parts,
)
from .checkpoints import LOAD_ERRORS, CheckpointError, checkpoint_file_problem, read_checkpoint
from .errors import UserError, file_error, first_line, run_main
from .text import iter_lines, read_lines

__all__ = [
    "LOAD_ERRORS",
    "TEMP_SUFFIX",
    "CheckpointError",
    "UserError",
    "atomic_copy",
    "atomic_write",
    "atomic_write_text",
    "checkpoint_file_problem",
    "file_error",
    "first_line",
    "iter_lines",
    "make_temp_dir",
    "read_checkpoint",
    "read_lines",
    "run_main",
    "temp_destination",
    "temp_name_parts",
]
