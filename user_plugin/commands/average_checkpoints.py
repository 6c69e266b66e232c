"""Average the parameters of several fairseq checkpoints into one (paper §6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20
checkpoints." With fairseq, checkpoints written every K updates
(``--save-interval-updates K``) are named ``checkpoint_<epoch>_<update>.pt``, and per-epoch ones
``checkpoint<epoch>.pt``; this script picks the last N of either kind from a directory, or takes
a list of files, and writes their elementwise mean.

fairseq's own ``scripts/average_checkpoints.py`` is not part of its wheel; this is the project's
own, with the same command line::

    vaswani-average --inputs CHECKPOINT_DIR --num-update-checkpoints 5 \\
        --output CHECKPOINT_DIR/checkpoint_avg5.pt [--checkpoint-upper-bound 100000]

The averaging itself (what is checked, what is kept) is
:func:`user_plugin.artifacts.averaging.average_checkpoints`. The output never replaces an input
(the same path or the same file, a hard link included) nor a training checkpoint (one holding an
optimizer state, such as ``checkpoint_last.pt``, or a name fairseq-train resumes from in a save
directory): both are refused before anything is read
(``user_plugin.files.atomic.refuse_input_clash``). The output is written atomically and read
back and verified before it is moved into place: nothing is written when anything goes wrong, a
full disk included (one line).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

# Logging set up before fairseq is imported (see user_plugin.files).
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.artifacts.averaging import average_checkpoints, select_checkpoints  # noqa: E402
from user_plugin.artifacts.checkpoints import save_checkpoint  # noqa: E402
from user_plugin.files import (  # noqa: E402
    UserError,
    console_script,
    refuse_input_clash,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Average the parameters of fairseq checkpoints (paper §6.1: the last 5 for "
                    "base models, the last 20 for big ones).")
    parser.add_argument("--inputs", required=True, nargs="+", metavar="PATH",
                        help="checkpoint files to average, or one directory together with "
                             "--num-update-checkpoints or --num-epoch-checkpoints")
    parser.add_argument("--output", required=True, metavar="FILE",
                        help="where to write the averaged checkpoint (atomically)")
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument("--num-update-checkpoints", type=int, metavar="N",
                           help="average the last N checkpoint_<epoch>_<update>.pt of the "
                                "directory, by update number")
    selection.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                           help="average the last N checkpoint<epoch>.pt of the directory")
    parser.add_argument("--checkpoint-upper-bound", type=int, metavar="U",
                        help="ignore checkpoints past update (or epoch) U")
    return parser


def resolve_inputs(args: argparse.Namespace) -> list[Path]:
    """The checkpoint files named by the command line, newest first for a directory."""
    counts = [n for n in (args.num_update_checkpoints, args.num_epoch_checkpoints) if n is not None]
    selecting = bool(counts)
    if args.checkpoint_upper_bound is not None and not selecting:
        raise UserError("--checkpoint-upper-bound needs --num-update-checkpoints or "
                        "--num-epoch-checkpoints")
    if selecting:
        if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
            raise UserError(f"--num-*-checkpoints needs --inputs to be one directory, got "
                            f"{' '.join(args.inputs)}")
        by = "update" if args.num_update_checkpoints is not None else "epoch"
        return select_checkpoints(Path(args.inputs[0]), counts[0], by,
                                  args.checkpoint_upper_bound)
    directories = [path for path in args.inputs if Path(path).is_dir()]
    if directories:
        raise UserError(f"{directories[0]}: is a directory; give --num-update-checkpoints N or "
                        "--num-epoch-checkpoints N to pick checkpoints from it")
    return [Path(path) for path in args.inputs]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    paths = resolve_inputs(args)
    refuse_input_clash(args.output, paths)  # also a training checkpoint (checkpoint_last.pt)
    print(f"averaging {len(paths)} checkpoint(s): {', '.join(str(path) for path in paths)}",
          flush=True)
    state = average_checkpoints(paths)
    save_checkpoint(state, Path(args.output), inputs=paths)
    count = sum(tensor.numel() for tensor in {id(t): t for t in state["model"].values()}.values())
    print(f"wrote {args.output} ({count:,} averaged values)")
    return 0


PROG = "vaswani-average"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
