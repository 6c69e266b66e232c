"""Draw fairseq-train logs as training curves: one PNG, every panel against updates.

    vaswani-plot-training LOG [LOG ...] --output curves.png [--labels A B ...]
    vaswani-plot-training LOG --summary

Panels: loss (training, solid, and validation, dashed; label-smoothed cross-entropy in bits,
as fairseq logs it), validation perplexity (of the NLL, log scale), learning rate, and
validation BLEU when the run had ``--eval-bleu``. With two or more logs the runs are overlaid,
one colour each, labelled by ``--labels`` or by their run directory (``.../RUN/checkpoints/
train.log`` -> ``RUN``). Logs of ``--log-format simple`` or ``json`` are read
(``user_plugin.training_log``); a log that was appended to by a resumed run is drawn as the run
went on. The PNG is written atomically.

``--summary`` prints, instead of a picture, the best validation BLEU (or loss) and the last
validation figures of each log. A missing, empty or malformed log is one error line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write,
    console_script,
    refuse_input_clash,
)
from user_plugin.training_log import TrainingLog, read_training_log  # noqa: E402

#: (panel, statistic, title, log scale) of each panel; the loss panel has two series per run.
PANELS = (
    ("loss", "loss", "loss (label-smoothed, bits)", False),
    ("ppl", "ppl", "validation perplexity", True),
    ("lr", "lr", "learning rate", False),
    ("bleu", "bleu", "validation BLEU", False),
)


def run_label(path: Path) -> str:
    """A run's name from its log's path: the run directory of ``RUN/checkpoints/train.log``,
    else the log's parent directory and name."""
    path = path.resolve()
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return path.parent.parent.name
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def labels_for(logs: Sequence[TrainingLog], given: Sequence[str] | None) -> list[str]:
    """``given`` when there is one per log; else :func:`run_label`, made unique."""
    if given:
        if len(given) != len(logs):
            raise UserError(f"--labels: {len(given)} labels for {len(logs)} logs")
        return list(given)
    labels = [run_label(log.path) for log in logs]
    if len(set(labels)) < len(labels):
        labels = [str(log.path) for log in logs]
    return labels


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or a one-line error."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("matplotlib is not installed (pip install matplotlib)") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def build_figure(logs: Sequence[TrainingLog], labels: Sequence[str]):
    """The figure of every log's panels (a matplotlib ``Figure``; the caller closes it)."""
    plt = pyplot()

    with_bleu = any(log.series("valid", "bleu").updates for log in logs)
    panels = [panel for panel in PANELS if panel[0] != "bleu" or with_bleu]
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    axes = axes.flatten()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (key, stat, title, log_scale) in enumerate(panels):
        ax = axes[index]
        for run, (log, label) in enumerate(zip(logs, labels)):
            colour = colours[run % len(colours)]
            if key == "loss":
                train, valid = log.series("train", stat), log.series("valid", stat)
                ax.plot(train.updates, train.values, color=colour, linewidth=1,
                        label=f"{label}: train")
                ax.plot(valid.updates, valid.values, color=colour, linestyle="--",
                        marker="o", markersize=3, label=f"{label}: validation")
            else:
                kind = "train" if key == "lr" else "valid"
                series = log.series(kind, stat)
                marker = None if kind == "train" else "o"
                ax.plot(series.updates, series.values, color=colour, marker=marker,
                        markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("updates")
        if log_scale:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if key == "loss" or len(logs) > 1:
            ax.legend(fontsize=8)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    figure.suptitle("training curves: " + ", ".join(labels), fontsize=11)
    figure.tight_layout()
    return figure


def draw(logs: Sequence[TrainingLog], labels: Sequence[str], output: Path, dpi: int,
         inputs: Sequence[Path] = ()) -> None:
    """Draw the panels of every log into the PNG ``output`` (atomically), never over one of
    ``inputs``."""
    figure = build_figure(logs, labels)

    def write(temp: str) -> None:
        figure.savefig(temp, format="png", dpi=dpi)

    try:
        atomic_write(output, write, inputs)
    finally:
        pyplot().close(figure)


def summary(log: TrainingLog, label: str) -> str:
    """One line: the best validation BLEU (or the lowest validation loss) and the last
    validation figures of ``log``."""
    bleu, loss, ppl = (log.series("valid", name) for name in ("bleu", "loss", "ppl"))
    parts = [f"{label}:"]
    if bleu.updates:
        update, value = bleu.best(maximize=True)
        parts.append(f"best validation BLEU {value:.2f} at update {update} "
                     "(checkpoint_best.pt);")
    elif loss.updates:
        update, value = loss.best(maximize=False)
        parts.append(f"lowest validation loss {value:.3f} at update {update};")
    last = loss.last() or ppl.last() or bleu.last()
    if last is None:
        parts.append("no validation records")
    else:
        update = last[0]
        figures = [f"{name} {series.values[series.updates.index(update)]:.2f}"
                   for name, series in (("loss", loss), ("perplexity", ppl), ("BLEU", bleu))
                   if update in series.updates]
        parts.append(f"last validation (update {update}): " + ", ".join(figures))
    return " ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, metavar="LOG",
                        help="fairseq-train logs (--log-format simple or json)")
    parser.add_argument("--output", type=Path, metavar="PNG", help="the picture to write")
    parser.add_argument("--labels", nargs="+", metavar="LABEL",
                        help="one name per log for the legend (default: the run directories)")
    parser.add_argument("--summary", action="store_true",
                        help="print the best and last validation figures instead")
    parser.add_argument("--dpi", type=int, default=100)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.output is None and not args.summary:
        parser.error("give --output PNG (or --summary)")
    if args.output is not None:
        refuse_input_clash(args.output, args.logs)
    logs = [read_training_log(path) for path in args.logs]
    labels = labels_for(logs, args.labels)
    if args.summary:
        for log, label in zip(logs, labels):
            print(summary(log, label))
    if args.output is not None:
        draw(logs, labels, args.output, args.dpi, args.logs)
        print(f"wrote {args.output}")
    return 0


PROG = "vaswani-plot-training"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
