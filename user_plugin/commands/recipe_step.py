"""``vaswani-step``: the step engine of the shell recipes (:mod:`user_plugin.recipe_steps`) as
one command, which ``recipes/common.sh`` calls for every record, identity, check and restart.

Every argument is a word of the subcommand's form, never an option, so that directories and
settings texts may start with a dash or hold spaces. Each subcommand answers on stdout and by
its exit status: 0 yes (done, can continue, carried out), 3 no or refused, with the reason in
one line for the recipe to log or to stop with; bad input is ``vaswani-step: error: ...`` and
status 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from user_plugin import recipe_steps as steps
from user_plugin.files import UserError, console_script, file_error

PROG = "vaswani-step"
NO = 3

USAGE = f"""usage: {PROG} SUBCOMMAND WORD...

The step engine of the recipes (docs/recipes.md). Exit status 0: yes; 3: no or refused, with
the reason on stdout; 1: bad input.

  status DIR CONFIG [UPSTREAM...]     is the step in DIR done with these settings and inputs?
                                      (no: why; nothing when it has no record)
  require DIR STEP [INPUT...]         can a later step use the step STEP in DIR (finished, on
                                      these inputs as they are now)? (no: what to run first)
  restart DIR                         empty DIR for a step that is redone (refused while a live
                                      training run holds it)
  begin DIR CONFIG [UPSTREAM...]      record how partial work starts (DIR/.started)
  can-continue DIR CONFIG [UPSTREAM...]
                                      was the partial work in DIR started with these?
  begin-training [--start-over] DIR CONFIG [UPSTREAM...]
                                      resume, continue, start over or refuse the training in
                                      DIR, and record it; prints the lines that say what it
                                      does, then the action (fresh, resume, continue,
                                      start-over, or done: nothing to do)
  done DIR CONFIG [UPSTREAM...] -- OUTPUT...
                                      record the step in DIR as finished (DIR/.done)
  id PATH                             the identity of an input
  apart NAME=DIR... [-- NAME=DIR...]  are these step directories apart from each other and
                                      from the kept directories after --?
  keep-trained DIR SAVE_DIR START_OVER REASON
                                      may the data step in DIR redo its finished work
                                      (REASON) without deleting SAVE_DIR's checkpoints?
  lock-path DIR                       the lock file of the step in DIR (its parent is created)
  hold DIR FD CALLER STEP             lock it, open in the calling shell as descriptor FD, for
                                      the recipe CALLER at its STEP (no: who holds it)
  decoding NAME=VALUE...              are these decoding settings (fairseq's option names:
                                      beam=4 lenpen=0.6) in their ranges? (no: which is not)
"""


def _split(words: Sequence[str], usage: str, least: int) -> tuple[list[str], list[str]]:
    """``words`` before and after the first ``--``; a usage error when fewer than ``least``
    come before it."""
    words = list(words)
    before, after = (words[:words.index("--")], words[words.index("--") + 1:]) \
        if "--" in words else (words, [])
    if len(before) < least:
        raise UserError(f"usage: {PROG} {usage}")
    return before, after


def _step(words: Sequence[str], usage: str) -> tuple[Path, str, list[str]]:
    """DIR CONFIG [UPSTREAM...], with nothing after ``--``."""
    before, after = _split(words, usage, 2)
    if after or "--" in words:
        raise UserError(f"usage: {PROG} {usage}")
    return Path(before[0]), before[1], before[2:]


def _named(words: Sequence[str]) -> list[tuple[str, Path]]:
    pairs = []
    for word in words:
        name, sep, path = word.partition("=")
        if not sep or not name or not path:
            raise UserError(f"apart takes NAME=DIR words, got {word!r}")
        pairs.append((name, Path(path)))
    return pairs


def _answer(problem: str | None) -> int:
    """Status 0 for no problem; else the problem (when it says something) and status 3."""
    if problem is None:
        return 0
    if problem:
        print(problem)
    return NO


def _status(words: Sequence[str]) -> int:
    return _answer(steps.done_problem(*_step(words, "status DIR CONFIG [UPSTREAM...]")))


def _require(words: Sequence[str]) -> int:
    directory, step, inputs = _step(words, "require DIR STEP [INPUT...]")
    return _answer(steps.require_problem(directory, step, inputs))


def _restart(words: Sequence[str]) -> int:
    if len(words) != 1:
        raise UserError(f"usage: {PROG} restart DIR")
    steps.restart(Path(words[0]))
    return 0


def _begin(words: Sequence[str]) -> int:
    steps.begin(*_step(words, "begin DIR CONFIG [UPSTREAM...]"))
    return 0


def _can_continue(words: Sequence[str]) -> int:
    return _answer(steps.continue_problem(*_step(words, "can-continue DIR CONFIG [UPSTREAM...]")))


def _begin_training(words: Sequence[str]) -> int:
    start_over = bool(words) and words[0] == "--start-over"
    directory, config, upstreams = _step(
        words[start_over:], "begin-training [--start-over] DIR CONFIG [UPSTREAM...]")
    plan = steps.begin_training(directory, config, upstreams, start_over=start_over)
    for line in (*plan.notes, plan.action):
        print(line)
    return 0


def _done(words: Sequence[str]) -> int:
    usage = "done DIR CONFIG [UPSTREAM...] -- OUTPUT..."
    before, outputs = _split(words, usage, 2)
    if not outputs:
        raise UserError(f"usage: {PROG} {usage}")
    steps.mark_done(Path(before[0]), before[1], before[2:], outputs)
    return 0


def _id(words: Sequence[str]) -> int:
    if len(words) != 1:
        raise UserError(f"usage: {PROG} id PATH")
    print(steps.input_id(words[0]))
    return 0


def _keep_trained(words: Sequence[str]) -> int:
    if len(words) != 4:
        raise UserError(f"usage: {PROG} keep-trained DIR SAVE_DIR START_OVER REASON")
    return _answer(steps.redo_problem(Path(words[0]), words[3], Path(words[1]), words[2]))


def _lock_path(words: Sequence[str]) -> int:
    if len(words) != 1:
        raise UserError(f"usage: {PROG} lock-path DIR")
    print(steps.step_lock_path(Path(words[0])))
    return 0


def _hold(words: Sequence[str]) -> int:
    if len(words) != 4 or not words[1].isdigit():
        raise UserError(f"usage: {PROG} hold DIR FD CALLER STEP")
    steps.hold(Path(words[0]), int(words[1]), words[2], words[3])
    return 0


def _apart(words: Sequence[str]) -> int:
    directories, kept = _split(words, "apart NAME=DIR... [-- NAME=DIR...]", 1)
    return _answer(steps.overlap_problem(_named(directories), _named(kept)))


def _decoding(words: Sequence[str]) -> int:
    """Are the decoding settings NAME=VALUE (fairseq's option names) in their ranges? Asked
    before a decoding step empties its directory, so that a bad value loses nothing."""
    import argparse

    from user_plugin.generation.decoding_options import OPTIONS, option_type

    for word in words:
        name, equals, text = word.partition("=")
        if not equals or name not in OPTIONS:
            raise UserError(f"decoding: {word!r} is not NAME=VALUE of a decoding option "
                            f"({', '.join(sorted(OPTIONS))})")
        try:
            option_type(name)(text)
        except argparse.ArgumentTypeError as error:
            return _answer(f"{name.upper()}: {error}")
    return 0


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "status": _status, "require": _require, "restart": _restart, "begin": _begin,
    "can-continue": _can_continue, "begin-training": _begin_training, "done": _done,
    "id": _id, "apart": _apart, "keep-trained": _keep_trained, "lock-path": _lock_path,
    "hold": _hold, "decoding": _decoding,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand of ``argv`` (default: the command line); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    if not argv or argv[0] not in SUBCOMMANDS:
        given = f" {argv[0]!r}" if argv else ""
        raise UserError(f"unknown subcommand{given}: one of {', '.join(SUBCOMMANDS)} "
                        f"({PROG} --help)")
    try:
        return SUBCOMMANDS[argv[0]](argv[1:])
    except steps.StepRefused as refusal:
        print(refusal)
        return NO
    except OSError as error:  # a directory that cannot be listed, a record that cannot go...
        raise file_error(error.filename or argv[0], error) from None


cli_main = console_script(main, PROG)
