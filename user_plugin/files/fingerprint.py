"""What a model was trained on, stored in its checkpoints and compared by every consumer.

A model's parameters mean something only with the dictionaries it was trained with, in their
token order (row N of the embedding is token N), and in its language direction. Two
dictionaries of the same size with the same tokens in another order give tensors of the same
shapes, so shapes cannot tell them apart: averaging such checkpoints, ensembling them, resuming
on such data or decoding with such a dictionary gives garbage without a word.

The **training fingerprint** (:func:`task_fingerprint`) is a small dict of plain strings:

* ``source_lang``, ``target_lang``: the direction;
* ``source_dictionary``, ``target_dictionary``: the sha256 of each dictionary's token order
  (:func:`dictionary_sha256`: the symbols joined by LF, UTF-8; counts do not matter to a
  model).

fairseq-train writes it into every checkpoint under the top-level key :data:`KEY` (the plugin's
save hook, :mod:`user_plugin.training_run`); copies, the averager and the export carry it.
:func:`fingerprint_mismatch` and :func:`dictionary_mismatch` compare two of them in one
sentence naming both, :func:`ensemble_mismatch` the checkpoints of an ensemble;
:func:`describe` writes one as ``en->de, dictionaries 1a2b3c4d5e6f / 1a2b3c4d5e6f``. A
checkpoint written before fingerprints were stored has none: consumers load it with one note
line (:func:`missing_note`), since it cannot be checked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence

#: The checkpoint's top-level key holding its training fingerprint.
KEY = "training_data"
#: The fingerprint's fields.
FIELDS = ("source_lang", "target_lang", "source_dictionary", "target_dictionary")


def dictionary_sha256(symbols: Iterable[str]) -> str:
    """The sha256 (hex) of a dictionary's token order: its symbols joined by LF."""
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()


def fingerprint(source_lang: str, target_lang: str, source_symbols: Iterable[str],
                target_symbols: Iterable[str]) -> dict[str, str]:
    """The training fingerprint of a direction and two dictionaries (their symbols)."""
    return {
        "source_lang": str(source_lang), "target_lang": str(target_lang),
        "source_dictionary": dictionary_sha256(source_symbols),
        "target_dictionary": dictionary_sha256(target_symbols),
    }


def task_fingerprint(task) -> dict[str, str] | None:
    """The fingerprint of a fairseq translation task (its dictionaries and languages), or None
    for a task without a source and a target dictionary."""
    try:
        source, target = task.source_dictionary, task.target_dictionary
    except (AttributeError, NotImplementedError):
        return None
    cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    src, tgt = getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None)
    if source is None or target is None or not src or not tgt:
        return None
    return fingerprint(src, tgt, source.symbols, target.symbols)


def stored_fingerprint(state: Mapping) -> dict[str, str] | None:
    """The fingerprint a checkpoint's state holds, or None (a checkpoint written before
    fingerprints were stored, or not by fairseq-train)."""
    found = state.get(KEY) if isinstance(state, Mapping) else None
    if not isinstance(found, Mapping) or any(not isinstance(found.get(f), str) for f in FIELDS):
        return None
    return {field: found[field] for field in FIELDS}


def describe(found: Mapping[str, str]) -> str:
    """One fingerprint in a few words: ``en->de, dictionaries 1a2b3c4d5e6f / 1a2b3c4d5e6f``."""
    return (f"{found['source_lang']}->{found['target_lang']}, dictionaries "
            f"{found['source_dictionary'][:12]} / {found['target_dictionary'][:12]}")


def fingerprint_mismatch(expected: Mapping[str, str], found: Mapping[str, str],
                         expected_name: str, found_name: str) -> str | None:
    """How ``found`` differs from ``expected`` (direction or a dictionary's token order), in
    one sentence naming both fingerprints; None when they are the same."""
    if all(expected[field] == found[field] for field in FIELDS):
        return None
    if (found["source_lang"], found["target_lang"]) != \
            (expected["source_lang"], expected["target_lang"]):
        what = "another language direction"
    else:
        what = "other dictionaries (another token order)"
    return (f"{found_name} was trained on {describe(found)} but {expected_name} is "
            f"{describe(expected)}: {what}")


def dictionary_mismatch(expected: Mapping[str, str], found: Mapping[str, str],
                        expected_name: str, found_name: str) -> str | None:
    """Like :func:`fingerprint_mismatch` for the dictionaries of each language only, whatever
    the direction (a model may be asked to translate the other way, which is warned about
    elsewhere): None when every language both name has the same token order."""
    mine = {expected["source_lang"]: expected["source_dictionary"],
            expected["target_lang"]: expected["target_dictionary"]}
    theirs = {found["source_lang"]: found["source_dictionary"],
              found["target_lang"]: found["target_dictionary"]}
    for lang in sorted(mine.keys() & theirs.keys()):
        if mine[lang] != theirs[lang]:
            return (f"{found_name} was trained on {describe(found)} but {expected_name} is "
                    f"{describe(expected)}: the {lang} dictionary differs (other tokens, or the "
                    "same in another order)")
    return None


def ensemble_mismatch(named: Sequence[tuple[str | os.PathLike, Mapping[str, str] | None]]
                      ) -> str | None:
    """For checkpoints meant to be used together (an ensemble, an average), given as
    ``(path, stored fingerprint or None)``: the line saying which two were trained on
    different data, naming both fingerprints; None when every known fingerprint agrees."""
    known = [(path, found) for path, found in named if found is not None]
    for path, found in known[1:]:
        mismatch = fingerprint_mismatch(known[0][1], found, str(known[0][0]), str(path))
        if mismatch is not None:
            return f"these checkpoints cannot be used together: {mismatch}"
    return None


def missing_note(paths: Iterable[str | os.PathLike]) -> str:
    """The one note line for checkpoints without a fingerprint."""
    names = ", ".join(str(path) for path in paths)
    return (f"note: {names}: no training fingerprint (written before checkpoints stored "
            "one): its dictionaries and language direction cannot be checked")
