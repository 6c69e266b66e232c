"""Reading fairseq-train's log: the training and validation statistics against updates.

fairseq-train logs through Python's logging, one record per line,
``DATE TIME | LEVEL | NAME | MESSAGE``. The records read here are those of its progress bars,
in either ``--log-format simple`` or ``json`` (``tqdm`` falls back to ``simple`` when the
output is not a terminal, as in a log file):

* ``train_inner`` (every ``--log-interval`` updates): ``epoch 001:     50 / 227 loss=9.1,
  ..., num_updates=50, lr=6e-05, ...`` or a JSON object with the same keys;
* ``train`` (end of an epoch): ``epoch 001 | loss 8.2 | ... | num_updates 227`` or JSON
  with keys ``train_loss``, ...; used only when a log has no ``train_inner`` record;
* a validation subset's (named after it, e.g. ``valid``): ``epoch 001 | valid on 'valid'
  subset | loss 7.4 | nll_loss 6.5 | ppl 87.5 | bleu 12.3 | ... | num_updates 300`` or JSON
  with keys ``valid_loss``, ...; the first subset met is kept (fairseq tracks the best
  checkpoint on it);
* ``fairseq_cli.train``'s ``done training in S seconds`` (one per completed run).

Lines of ``--log-file`` (fairseq writes there the bare messages, without the prefix) are read
as well, recognised by their contents.

A log that a resumed run appended to holds records of updates it saw before: a record at an
update at or below the last one of its series starts over from there (the later run wins).
Lines that are not such records (other messages, a line cut short by a kill) are skipped; a
log without any record is a one-line :class:`~user_plugin.files.UserError`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import UserError, iter_lines

_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| (?P<name>[^|]+?) \| (?P<message>.*)$")
_SIMPLE_INNER = re.compile(r"(?P<key>[A-Za-z_][\w]*)=(?P<value>[^,\s]+)")
_SIMPLE_INNER_PREFIX = re.compile(r"epoch \d+:\s+\d+ / \d+ ")
_SIMPLE_EPOCH_PREFIX = re.compile(r"epoch \d+ \| ")
_VALID_PREFIX = re.compile(r"valid on '(?P<subset>[^']+)' subset")
_DONE = re.compile(r"done training in (?P<seconds>[\d.]+) seconds")


@dataclass
class Series:
    """Values of one statistic against the update they were logged at."""

    updates: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, update: int, value: float) -> None:
        """Append a point; a point at or before the last update drops the points from that
        update on (a resumed run logging again what an earlier run logged)."""
        while self.updates and self.updates[-1] >= update:
            self.updates.pop()
            self.values.pop()
        self.updates.append(update)
        self.values.append(value)

    def last(self) -> tuple[int, float] | None:
        """The last point, or None."""
        return (self.updates[-1], self.values[-1]) if self.updates else None

    def best(self, maximize: bool) -> tuple[int, float] | None:
        """The point of the largest (``maximize``) or smallest value, the earliest of ties."""
        if not self.values:
            return None
        pick = max if maximize else min
        index = self.values.index(pick(self.values))
        return self.updates[index], self.values[index]


@dataclass
class TrainingLog:
    """The statistics of one fairseq-train log.

    ``train``: statistic name -> :class:`Series` of ``train_inner`` records (``train`` records
    when there are none); ``valid``: the same for the first validation subset,
    ``valid_subset`` its name; ``training_seconds``: the durations fairseq reported for the
    runs that finished.
    """

    path: Path
    train: dict[str, Series] = field(default_factory=dict)
    valid: dict[str, Series] = field(default_factory=dict)
    valid_subset: str | None = None
    training_seconds: list[float] = field(default_factory=list)

    def series(self, kind: str, name: str) -> Series:
        """``kind`` (``train`` or ``valid``) statistic ``name``; empty when never logged."""
        return getattr(self, kind).get(name, Series())


def _number(value: object) -> float | None:
    """A logged value as a float (fairseq's JSON holds numbers as strings), or None."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _pipe_fields(message: str) -> dict[str, str]:
    """``key value`` fields of a ``simple`` end-of-epoch or validation line."""
    fields = {}
    for part in message.split(" | "):
        key, _, value = part.strip().partition(" ")
        if key and value and " " not in value.strip():
            fields[key] = value.strip()
    return fields


def _json_record(message: str) -> dict[str, object] | None:
    """The JSON object of a ``--log-format json`` message, or None."""
    if not message.startswith("{"):
        return None
    try:
        record = json.loads(message)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _classify(name: str | None, message: str) -> tuple[str, dict[str, object]] | None:
    """What a record is, ``train_inner``, ``train``, ``valid:<subset>`` or ``done``, and its
    fields; None for anything else. ``name`` is the logger's name when the line has fairseq's
    prefix (stdout, a ``tee``'d log), None for ``--log-file``'s bare messages."""
    record = _json_record(message)
    if record is not None:
        if "num_updates" in record:
            return ("train_inner", record) if name in (None, "train_inner") else None
        for key in record:
            if key.endswith("_num_updates"):
                tag = key[: -len("_num_updates")]
                if name not in (None, tag):
                    return None
                fields = {k[len(tag) + 1:]: v for k, v in record.items()
                          if k.startswith(f"{tag}_")}
                return ("train" if tag == "train" else f"valid:{tag}"), fields
        return None
    inner = _SIMPLE_INNER_PREFIX.match(message)
    if inner is not None:
        if name not in (None, "train_inner"):
            return None
        return "train_inner", {m.group("key"): m.group("value")
                               for m in _SIMPLE_INNER.finditer(message[inner.end():])}
    subset = _VALID_PREFIX.search(message)
    if subset is not None and message.startswith("epoch "):
        if name not in (None, subset.group("subset")):
            return None
        return f"valid:{subset.group('subset')}", _pipe_fields(message)
    if _SIMPLE_EPOCH_PREFIX.match(message):
        return ("train", _pipe_fields(message)) if name in (None, "train") else None
    done = _DONE.search(message)
    if done is not None and name in (None, "fairseq_cli.train"):
        return "done", {"seconds": done.group("seconds")}
    return None


def _add_record(target: dict[str, Series], fields: dict[str, object]) -> bool:
    """Add every numeric field of one record at its ``num_updates``; False when it has none."""
    update = _number(fields.get("num_updates"))
    if update is None:
        return False
    for key, value in fields.items():
        number = _number(value)
        if key != "num_updates" and number is not None:
            target.setdefault(key, Series()).add(int(update), number)
    return True


def read_training_log(path: str | os.PathLike) -> TrainingLog:
    """Parse the fairseq-train log ``path`` (see the module's docstring).

    A missing, unreadable or non-UTF-8 file, an empty one, or one without any training or
    validation record is a one-line :class:`~user_plugin.files.UserError` naming it.
    """
    log = TrainingLog(Path(path))
    epoch_train: dict[str, Series] = {}
    empty = True
    for line in iter_lines(path):
        if not line.strip():
            continue
        empty = False
        match = _RECORD.match(line)
        if match is not None:
            found = _classify(match.group("name").strip(), match.group("message").strip())
        else:
            found = _classify(None, line.strip())
        if found is None:
            continue
        kind, fields = found
        if kind == "train_inner":
            _add_record(log.train, fields)
        elif kind == "train":
            _add_record(epoch_train, fields)
        elif kind == "done":
            log.training_seconds.append(float(fields["seconds"]))  # type: ignore[arg-type]
        else:
            subset = kind.split(":", 1)[1]
            if log.valid_subset in (None, subset) and _add_record(log.valid, fields):
                log.valid_subset = subset
    if not log.train:
        log.train = epoch_train
    if empty:
        raise UserError(f"{path}: empty log")
    if not log.train and not log.valid:
        raise UserError(
            f"{path}: no fairseq-train records (train_inner, train or validation lines of "
            "--log-format simple or json) found")
    return log
