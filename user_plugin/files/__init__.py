"""The project's file chores, in one place for the plugin and every script.

* :mod:`.errors`: :class:`UserError` (bad input or files, reported as one line) and
  :class:`InvalidValue` (an option or value out of range, also a ``ValueError``),
  :func:`first_line`, :func:`run_main` (``prog: error: ...`` and exit status 1; an interrupt
  as ``prog: interrupted: WHAT WAS LEFT`` and status 130) and
  :func:`console_script` (an installed command's entry point through it),
  :func:`file_error` (an ``OSError``/``UnicodeDecodeError`` about a path as one line: a full
  disk is ``PATH: cannot write (no space left on device)``) and
  :func:`int_at_least` (an argparse type for bounded integers);
* :mod:`.atomic`: :func:`atomic_write`, :func:`atomic_write_text`, :func:`atomic_copy` (a
  locked temporary file beside the destination, then ``os.replace``), the temporary files'
  names, :func:`remove_stale_temporaries` (those left by killed writes), and
  :func:`refuse_input_clash` (an output never is, holds or lies inside an input, nor is a
  training checkpoint: :mod:`.training_state`);
* :mod:`.text`: the line rule (only LF ends a line) for every reader of line-aligned text,
  :func:`iter_lines`, :func:`split_lines`, :func:`decode_lines`, :func:`single_line`; and
  :func:`read_lines` (universal newlines) for logs;
* :mod:`.lock`: :class:`DirectoryLock`, one process at a time in a directory;
* :mod:`.training_state`: what a training run keeps in its save directory (checkpoints holding
  an optimizer state, fairseq's checkpoint names, the run's lock), so that no output replaces
  it;

Checkpoints and training fingerprints are trained-model files: :mod:`user_plugin.artifacts`.

Importing this package needs neither torch nor fairseq.
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
    refuse_input_clash,
    remove_stale_temporaries,
    same_file,
    temp_destination,
    temp_name_parts,
)
from .errors import (
    InvalidValue,
    UserError,
    console_script,
    file_error,
    first_line,
    int_at_least,
    run_main,
)
from .lock import DirectoryInUse, DirectoryLock
from .text import decode_lines, iter_lines, read_lines, single_line, split_lines

__all__ = [
    "int_at_least",
    "InvalidValue",
    "TEMP_SUFFIX",
    "DirectoryInUse",
    "DirectoryLock",
    "UserError",
    "atomic_copy",
    "atomic_write",
    "atomic_write_text",
    "decode_lines",
    "file_error",
    "first_line",
    "iter_lines",
    "console_script",
    "make_temp_dir",
    "read_lines",
    "refuse_input_clash",
    "remove_stale_temporaries",
    "same_file",
    "run_main",
    "single_line",
    "split_lines",
    "temp_destination",
    "temp_name_parts",
]
