#!/usr/bin/env python3
"""Compare finished runs of the demo recipe side by side: test BLEU (sacreBLEU and tokenized),
validation figures, training time, and their training curves overlaid.

    python scripts/parity_report.py --run "vaswani_transformer=work_dirs/demo_multi30k/base" \\
        --run "fairseq transformer=work_dirs/demo_multi30k/builtin_transformer" \\
        --output-dir work_dirs/demo_multi30k/parity

Each ``--run LABEL=RUN_DIR`` is a run directory of the recipes (``checkpoints/train.log``,
``score/bleu.json``). The report says, for each run, whether the plugin was in its training and
decoding processes: fairseq logs its configuration, ``user_dir`` included, at the start of
``train.log`` and of ``generate/generate.log`` (where the recipe kept it), so a built-in
``transformer`` trained by stock fairseq (no ``--user-dir``) shows ``user_dir: None``.

Writes ``parity.md`` (the table, the machine and versions), ``parity.json``
(the same figures) and ``parity_curves.png`` (vaswani-plot-training's panels, runs
overlaid) into ``--output-dir``, each atomically. ``recipes/parity_multi30k.sh`` runs it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.commands.plot_training import draw  # noqa: E402
from user_plugin.files import UserError, atomic_write_text, file_error, run_main  # noqa: E402
from user_plugin.training_log import read_training_log  # noqa: E402


def parse_run(text: str) -> tuple[str, Path]:
    """``LABEL=RUN_DIR`` -> (label, run directory)."""
    label, sep, directory = text.partition("=")
    if not sep or not label.strip() or not directory.strip():
        raise argparse.ArgumentTypeError(f"expected LABEL=RUN_DIR, got {text!r}")
    return label.strip(), Path(directory.strip())


def read_scores(path: Path) -> dict:
    """The score step's ``bleu.json``, or a one-line error naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            scores = json.load(handle)
    except (OSError, UnicodeDecodeError) as error:
        raise file_error(path, error, expected="the score step's bleu.json") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
    try:
        return {
            "sacrebleu": scores["sacrebleu"]["score"],
            "sacrebleu_bp": scores["sacrebleu"]["brevity_penalty"],
            "sacrebleu_signature": scores["sacrebleu"]["signature"],
            "tokenized_bleu": scores["tokenized_bleu"]["score"],
            "num_sentences": scores["num_sentences"],
        }
    except (KeyError, TypeError) as error:
        raise UserError(f"{path}: not a bleu.json of vaswani-score "
                        f"(no {error})") from None


_USER_DIR = re.compile(r"'user_dir': (None|'[^']*')")


def user_dir_of(log_path: Path) -> str | None:
    """What a fairseq log says its process loaded as ``--user-dir``: ``"none"`` (stock
    fairseq), the path, or None when the log is absent or holds no configuration."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = _USER_DIR.search(text)
    if found is None:
        return None
    return "none" if found.group(1) == "None" else found.group(1).strip("'")


def plugin_cell(user_dir: str | None) -> str:
    if user_dir is None:
        return "not recorded"
    return "no (stock fairseq)" if user_dir == "none" else f"yes (`{Path(user_dir).name}`)"


def run_figures(label: str, run_dir: Path) -> dict:
    """Test scores and validation figures of one run directory."""
    log = read_training_log(run_dir / "checkpoints" / "train.log")
    figures = {"label": label, "run_dir": str(run_dir),
               **read_scores(run_dir / "score" / "bleu.json")}
    bleu, ppl = log.series("valid", "bleu"), log.series("valid", "ppl")
    best = bleu.best(maximize=True)
    figures["best_valid_bleu"] = best[1] if best else None
    figures["best_valid_bleu_update"] = best[0] if best else None
    figures["last_valid_ppl"] = ppl.last()[1] if ppl.last() else None
    figures["last_valid_bleu"] = bleu.last()[1] if bleu.last() else None
    figures["training_seconds"] = sum(log.training_seconds) or None
    figures["train_user_dir"] = user_dir_of(run_dir / "checkpoints" / "train.log")
    figures["generate_user_dir"] = user_dir_of(run_dir / "generate" / "generate.log")
    figures["log"] = log
    return figures


def _cell(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def machine() -> str:
    """The CPU, its cores and the versions that matter, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for package in ("torch", "fairseq-fixed", "fairseq", "sacrebleu"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            + ", ".join(versions))


def markdown(runs: Sequence[dict], curves: str) -> str:
    """The comparison table and its context."""
    lines = [
        "| model | sacreBLEU (BP) | tokenized BLEU | best validation BLEU (update) "
        "| last validation BLEU | last validation perplexity | training time "
        "| plugin loaded: training / decoding |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        seconds = run["training_seconds"]
        time = "–" if seconds is None else f"{seconds / 60:.1f} min"
        best = _cell(run["best_valid_bleu"], 2)
        if run["best_valid_bleu_update"] is not None:
            best += f" ({run['best_valid_bleu_update']})"
        lines.append(
            f"| {run['label']} | **{run['sacrebleu']:.2f}** ({run['sacrebleu_bp']:.3f}) "
            f"| {run['tokenized_bleu']:.2f} | {best} | {_cell(run['last_valid_bleu'], 2)} "
            f"| {_cell(run['last_valid_ppl'], 2)} | {time} "
            f"| {plugin_cell(run['train_user_dir'])} / {plugin_cell(run['generate_user_dir'])} |")
    signature = runs[0]["sacrebleu_signature"]
    lines += [
        "",
        f"Test: {runs[0]['num_sentences']} sentences; sacreBLEU signature `{signature}`; "
        "tokenized BLEU: Moses tokenization with compound splitting. Models: the average of "
        "the last checkpoints; validation BLEU: during training, per checkpoint.",
        "Plugin loaded: whether the process had the plugin (`--user-dir`), read from the "
        "configuration fairseq logs at the start of `train.log` and `generate/generate.log`; a "
        "run without it is stock fairseq, unchanged by the plugin's fairseq patches.",
        f"Machine: {machine()}.",
        f"Curves: `{curves}`.",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", dest="runs", action="append", required=True, type=parse_run,
                        metavar="LABEL=RUN_DIR", help="a finished run (repeat)")
    parser.add_argument("--output-dir", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = [run_figures(label, run_dir) for label, run_dir in args.runs]
    curves = args.output_dir / "parity_curves.png"
    draw([run["log"] for run in runs], [run["label"] for run in runs], curves, dpi=100)
    for run in runs:
        del run["log"]
    atomic_write_text(args.output_dir / "parity.json", json.dumps(runs, indent=2) + "\n")
    atomic_write_text(args.output_dir / "parity.md", markdown(runs, str(curves)))
    print(f"wrote {args.output_dir / 'parity.md'}, parity.json and parity_curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, Path(sys.argv[0]).name))
