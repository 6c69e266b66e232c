"""``vaswani-user-dir`` (also ``python -m user_plugin``): print the plugin's ``--user-dir`` path.

fairseq loads a plugin from a directory (``--user-dir``), not from an installed package name.
After ``pip install .`` that directory is inside ``site-packages``; this command prints it, so
that ``fairseq-train --user-dir "$(vaswani-user-dir)" --arch vaswani_base ...`` works from any
directory, with an editable install or a regular one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

PROG = "vaswani-user-dir"


def user_dir() -> Path:
    """The directory of the ``user_plugin`` package: the value for fairseq's ``--user-dir``."""
    return Path(__file__).resolve().parents[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Print :func:`user_dir` and return 0."""
    parser = argparse.ArgumentParser(prog=PROG, description=(
        "Print the directory to give fairseq's --user-dir, e.g. "
        'fairseq-train --user-dir "$(vaswani-user-dir)" --arch vaswani_base ...'))
    parser.parse_args(argv)
    print(user_dir())
    return 0


def cli_main() -> int:
    """The console script's entry point."""
    return main(sys.argv[1:])
