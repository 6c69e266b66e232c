"""Training progress against ``--max-update``, with the time left: one line per log interval.

fairseq-train logs its statistics every ``--log-interval`` updates (``train_inner``) but never
says how far the run is. For our runs (row ``progress_report`` of
:mod:`user_plugin.fairseq_patches` wraps ``fairseq_cli.train.train``, the loop of one epoch:
:func:`training_with_progress`), the progress bars that fairseq's
``progress_bar.progress_bar`` builds during the epoch are wrapped
(:func:`reporting_progress_bar`). The training bar (the one fairseq hands its configuration
through ``update_config``) then follows each ``train_inner`` record with a line of its own::

    ... | INFO | progress | update 150/1800 (8.3%) | elapsed 0:02:05 \
        | left 0:22:55 (0.83 s/update) | loss 7.412 | lr 0.000154

(one line in the log), or, under ``--log-format json``, a JSON record of the same figures
(times in seconds). No training loop of ours is involved: fairseq's loop, its logging and its
other loggers (TensorBoard, ...) run as they are.

The arithmetic (:class:`ProgressClock`) counts time from the moment this process starts
training (after loading a checkpoint and the validation dry run) and updates from the update
it resumed at. The time left is the updates still to do times the mean time per update so
far, validations and checkpoint writes included, so it settles as the run goes on. The clock
is injected, so the arithmetic is tested without waiting.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .temporary import replaced

logger = logging.getLogger("progress")


@dataclass(frozen=True)
class ProgressEstimate:
    """Where a run is: update ``num_updates`` of ``max_update`` (None: no bound known)."""

    num_updates: int
    max_update: int | None
    start_update: int
    elapsed: float
    seconds_per_update: float | None
    remaining: float | None

    @property
    def percent(self) -> float | None:
        """How much of the run is done, in percent (None without a bound)."""
        if not self.max_update:
            return None
        return 100.0 * min(self.num_updates, self.max_update) / self.max_update


class ProgressClock:
    """The progress arithmetic of one training run in this process.

    ``start_update`` is the number of updates done when this process started training (0, or
    the checkpoint's when resuming); ``clock`` returns seconds (``time.monotonic``).
    """

    def __init__(self, max_update: int | None, start_update: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_update = max_update if max_update and max_update > 0 else None
        self.start_update = start_update
        self.clock = clock
        self.start_time = clock()

    def estimate(self, num_updates: int) -> ProgressEstimate:
        """The estimate after ``num_updates`` updates: the seconds per update are the mean
        over this process's updates; the time left is that times the updates still to do."""
        elapsed = self.clock() - self.start_time
        done = num_updates - self.start_update
        per_update = elapsed / done if done > 0 else None
        remaining = None
        if per_update is not None and self.max_update is not None:
            remaining = max(self.max_update - num_updates, 0) * per_update
        return ProgressEstimate(num_updates, self.max_update, self.start_update, elapsed,
                                per_update, remaining)


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (rounded to the second; ``?`` when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    total = int(round(max(seconds, 0.0)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def progress_text(estimate: ProgressEstimate, loss: float | None = None,
                  lr: float | None = None) -> str:
    """The human-readable progress line (see the module's docstring)."""
    if estimate.max_update is None:
        parts = [f"update {estimate.num_updates}"]
    else:
        parts = [f"update {estimate.num_updates}/{estimate.max_update} "
                 f"({estimate.percent:.1f}%)"]
    parts.append(f"elapsed {format_duration(estimate.elapsed)}")
    if estimate.remaining is not None:
        parts.append(f"left {format_duration(estimate.remaining)} "
                     f"({estimate.seconds_per_update:.2f} s/update)")
    elif estimate.seconds_per_update is not None:
        parts.append(f"{estimate.seconds_per_update:.2f} s/update")
    if loss is not None:
        parts.append(f"loss {loss:.3f}")
    if lr is not None:
        parts.append(f"lr {lr:.3g}")
    return " | ".join(parts)


def progress_record(estimate: ProgressEstimate, loss: float | None = None,
                    lr: float | None = None) -> dict[str, Any]:
    """The progress line as a JSON-ready record (times in seconds), for ``--log-format json``."""
    record = asdict(estimate)
    record["percent"] = estimate.percent
    record["loss"] = loss
    record["lr"] = lr
    return record


def _number(stats: Mapping[str, Any], key: str) -> float | None:
    """``stats[key]`` as a float (fairseq logs floats, meters or numeric strings), or None."""
    value = stats.get(key)
    value = getattr(value, "avg", value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _updates_done() -> int:
    """The number of updates of the trainer, as fairseq's metrics hold it: the trainer logs
    ``num_updates`` into the global aggregator whenever it sets it (when loading a
    checkpoint); absent for a run that starts from scratch."""
    from fairseq.logging import metrics

    meter = metrics.get_meter("default", "num_updates")
    value = getattr(meter, "val", None)
    return int(value) if value is not None else 0


class ProgressReporter:
    """Writes the progress lines of the training run of this process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.progress: ProgressClock | None = None
        self.json = False

    def start(self, config: Mapping[str, Any], updates_per_epoch: int | None) -> None:
        """Begin (first training epoch of the process) or go on (later epochs) with the run
        of fairseq's flattened configuration ``config``."""
        if self.progress is not None:
            return
        optimization = config.get("optimization") or {}
        common = config.get("common") or {}
        max_update = int(optimization.get("max_update") or 0)
        max_epoch = int(optimization.get("max_epoch") or 0)
        if max_update <= 0 and max_epoch > 0 and updates_per_epoch:
            max_update = max_epoch * updates_per_epoch
        start = _updates_done()
        self.json = common.get("log_format") == "json"
        self.progress = ProgressClock(max_update, start, self.clock)
        bound = f"to update {max_update}" if max_update > 0 else "(no --max-update)"
        logger.info(f"training from update {start} {bound}; progress every "
                    f"{common.get('log_interval')} updates, time counted from now")

    def report(self, stats: Mapping[str, Any], step: int | None) -> None:
        """Log the progress after a ``train_inner`` record ``stats`` at update ``step``."""
        if self.progress is None:
            return
        num_updates = step if step is not None else _number(stats, "num_updates")
        if num_updates is None:
            return
        estimate = self.progress.estimate(int(num_updates))
        loss, lr = _number(stats, "loss"), _number(stats, "lr")
        if self.json:
            logger.info(json.dumps(progress_record(estimate, loss, lr)))
        else:
            logger.info(progress_text(estimate, loss, lr))


_REPORTER = ProgressReporter()


class ProgressReportingBar:
    """A fairseq progress bar that also reports progress (:class:`ProgressReporter`) after
    each ``train_inner`` record; everything else goes to the bar it wraps."""

    def __init__(self, wrapped: Any, reporter: ProgressReporter) -> None:
        self.wrapped = wrapped
        self.reporter = reporter
        self.training = False

    def __iter__(self):
        return iter(self.wrapped)

    def __len__(self) -> int:
        return len(self.wrapped)

    def __enter__(self):
        self.wrapped.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        return self.wrapped.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        wrapped = self.__dict__.get("wrapped")
        if wrapped is None:
            raise AttributeError(name)
        return getattr(wrapped, name)

    def update_config(self, config: Mapping[str, Any]) -> None:
        """fairseq hands the training bar (only that one) the run's configuration."""
        self.wrapped.update_config(config)
        self.training = True
        try:
            per_epoch = len(self.wrapped)
        except (TypeError, AttributeError):  # fairseq's logger wrappers have no length
            per_epoch = None
        self.reporter.start(config, per_epoch)

    def log(self, stats: Mapping[str, Any], tag: str | None = None,
            step: int | None = None) -> None:
        self.wrapped.log(stats, tag=tag, step=step)
        if self.training and tag == "train_inner":
            self.reporter.report(stats, step)

    def print(self, stats: Mapping[str, Any], tag: str | None = None,
              step: int | None = None) -> None:
        self.wrapped.print(stats, tag=tag, step=step)


def reporting_progress_bar(build: Callable[..., Any]) -> Callable[..., Any]:
    """fairseq's ``progress_bar.progress_bar``, returning bars that report progress."""

    @functools.wraps(build)
    def progress_bar(*args, **kwargs):
        return ProgressReportingBar(build(*args, **kwargs), _REPORTER)

    return progress_bar


def training_with_progress(train: Callable[..., Any]) -> Callable[..., Any]:
    """``fairseq_cli.train.train`` (one epoch of training), during which the bars that
    ``progress_bar.progress_bar`` builds report progress: fairseq's loop looks the builder up
    through the module at each call."""
    from fairseq.logging import progress_bar as bars

    reporting = reporting_progress_bar(bars.progress_bar)

    @functools.wraps(train)
    def train_reporting_progress(*args, **kwargs):
        with replaced(bars, "progress_bar", reporting):
            return train(*args, **kwargs)

    return train_reporting_progress
