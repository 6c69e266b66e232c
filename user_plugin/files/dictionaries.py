"""Checks of fairseq dictionary files (``dict.<lang>.txt``) that name the real problem.

fairseq reads an empty dictionary file as a dictionary of its four special symbols only, and a
file cut at a line end as a shorter dictionary; both then surface far from their cause (as
"needs a joined dictionary", or as a shape mismatch). A line cut in its middle is a
``ValueError`` that names no file. :func:`dictionary_file_problem` looks at one file,
:func:`cut_dictionary_problem` at the two of a language pair.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .errors import file_error


def dictionary_file_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the dictionary file ``path``, or None: an empty file, or a line that
    is not ``<token> <count> [flags]`` (a file cut in the middle of a line). A missing or
    unreadable file is left to the caller's reader."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.strip():
        return f"{path}: an empty dictionary (no tokens): binarize the data again"
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as error:
        return str(file_error(path, error))
    if lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        fields = line.rstrip().rsplit(" ", 2)
        count = fields[1] if len(fields) == 3 and fields[2].startswith("#") else fields[-1]
        if len(fields) < 2 or not count.lstrip("-").isdigit():
            cut = " (the file is cut?)" if number == len(lines) else ""
            return (f"{path}: line {number} is not '<token> <count>'{cut}: binarize the data "
                    "again")
    return None


def cut_dictionary_problem(source: tuple[str, Sequence[str]],
                           target: tuple[str, Sequence[str]]) -> str | None:
    """When one dictionary of a pair is a strict beginning of the other (``(path, symbols)``
    each), the line saying it looks cut; None otherwise (different dictionaries of a pair not
    joined are fine)."""
    (short_path, short), (long_path, long) = sorted((source, target), key=lambda d: len(d[1]))
    if len(short) < len(long) and list(long[:len(short)]) == list(short):
        return (f"{short_path}: holds only the first {len(short)} of the {len(long)} entries "
                f"of {long_path} (a cut copy of it?): binarize the data again")
    return None


def dictionary_symbols(path: str | os.PathLike) -> list[str]:
    """The tokens of a dictionary file, in order (without fairseq's special symbols)."""
    symbols = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.rstrip("\n").rsplit(" ", 2)
            if len(fields) == 3 and not fields[2].startswith("#"):
                fields = [f"{fields[0]} {fields[1]}", fields[2]]
            symbols.append(fields[0])
    return symbols


#: Of the subwords a codes file's merges make, the share its own run's dictionaries hold at
#: least: 97-98 % measured on the recipes' data, but a dictionary pruned by fairseq-preprocess'
#: ``--thresholdsrc`` lacks the rare ones (codes with more merges than the dictionaries' run,
#: learnt on the same text, make about 60 %, as a pruned dictionary may: not told apart).
MERGES_IN_DICTIONARY = 0.5
#: Of the dictionaries' subwords of two or more characters, the share that the codes' merges
#: must make (all of them for the codes of their run; about 60 % for codes with fewer merges,
#: under 40 % for codes learnt on other text).
DICTIONARY_MADE_BY_MERGES = 0.95


def bpe_codes_problem(codes: str | os.PathLike,
                      dictionaries: Sequence[str | os.PathLike]) -> str | None:
    """What makes the subword-nmt codes file ``codes`` unusable with the dictionary files
    ``dictionaries``, or None: no merges, a line that is not a merge, or codes of another run,
    seen from both sides.

    A merge ``a b`` makes ``ab@@`` inside a word and ``ab`` at its end (``b`` ending in
    ``</w>``). The dictionaries of the codes' own run hold most of the subwords the merges
    make (:data:`MERGES_IN_DICTIONARY`: fewer means codes of many more merges or of other
    text, which split words into subwords the model never saw), and each of their subwords of
    two or more characters is made by a merge (:data:`DICTIONARY_MADE_BY_MERGES`: fewer means
    codes of fewer merges or of other text, which leave the model's subwords unmade)."""
    codes = Path(codes)
    try:
        lines = codes.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as error:
        return str(file_error(codes, error, expected="a BPE codes file"))
    merges = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            return f"{codes}: line {number} is not a BPE merge ('<left> <right>'): {line[:60]!r}"
        merges.append(parts)
    if not merges:
        return f"{codes}: no BPE merges (an empty codes file)"
    known: set[str] = set()
    for path in dictionaries:
        known.update(dictionary_symbols(path))
    named = ", ".join(str(p) for p in dictionaries)
    made = {left + right[:-4] if right.endswith("</w>") else f"{left}{right}@@"
            for left, right in merges}
    found = len(made & known)
    if found < MERGES_IN_DICTIONARY * len(made):
        return (f"{codes}: only {found} of the {len(made)} subwords its merges make are in the "
                f"dictionaries ({named}): codes of more merges, or learnt on other text?")
    subwords = [token for token in known if len(_subword_core(token)) > 1
                and not _special(token)]
    unmade = sorted(token for token in subwords if token not in made)
    if len(unmade) > (1 - DICTIONARY_MADE_BY_MERGES) * len(subwords):
        examples = ", ".join(repr(token) for token in unmade[:3])
        return (f"{codes}: {len(unmade)} of the {len(subwords)} subwords of the dictionaries "
                f"({named}) are made by none of its merges (such as {examples}): codes of "
                "fewer merges, or learnt on other text?")
    return None


def _subword_core(token: str) -> str:
    """A BPE token without its continuation mark ``@@``."""
    return token[:-2] if token.endswith("@@") else token


def _special(token: str) -> bool:
    """fairseq's special symbols (``<unk>``...) and the filler types it pads a dictionary
    with (``madeupword0000``...), which no merge makes."""
    return (token.startswith("<") and token.endswith(">")) or token.startswith("madeupword")
