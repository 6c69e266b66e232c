#!/usr/bin/env python
"""Keep one GPU run's report in the repository: ``docs/gpu_runs/``, one file per run.

    python scripts/gpu_check/keep_report.py FILES_AT/gpu_report.json

copies the check's ``gpu_report.json`` (what the device tool brought back from ``$OUT``) to
``docs/gpu_runs/<started>-<device>-<sections>.json`` (``2026-11-27-0512-nvidia-h100-80gb-hbm3-
equivalence-speed.json``) and prints that path; then commit it. The report must come from a GPU
(not the CPU dry run) and name its device, torch and CUDA versions. A rerun with the same report
changes nothing; another report under the same name is refused. Writes are atomic.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from user_plugin.files import UserError, run_main  # noqa: E402
from user_plugin.files.atomic import atomic_write_text  # noqa: E402

RUNS = REPO / "docs" / "gpu_runs"


def report_name(report: dict) -> str:
    """``<started>-<device>-<sections>.json`` of a GPU report; a one-line error if it is none."""
    environment = report.get("environment") or {}
    if report.get("tiny") or environment.get("device") == "cpu":
        raise UserError("the report is the CPU dry run's, not a GPU run's")
    missing = [key for key in ("device", "torch", "cuda") if not environment.get(key)]
    if missing:
        raise UserError(f"the report names no {', '.join(missing)} (not a GPU run's report)")
    started = re.sub(r"[^0-9]", "", str(report.get("started", "")))[:12]
    if len(started) != 12:
        raise UserError("the report says no start time")
    device = re.sub(r"[^a-z0-9]+", "-", environment["device"].lower()).strip("-")
    sections = "-".join(report.get("sections", {})) or "none"
    return f"{started[:4]}-{started[4:8]}-{started[8:]}-{device}-{sections}.json"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--runs-dir", type=Path, default=RUNS)
    args = parser.parse_args(argv)
    try:
        text = args.report.read_text(encoding="utf-8")
        report = json.loads(text)
    except (OSError, ValueError) as error:
        raise UserError(f"{args.report}: not a readable JSON report ({error})") from None
    target = args.runs_dir / report_name(report)
    if target.exists():
        if target.read_text(encoding="utf-8") == text:
            print(target)
            return 0
        raise UserError(f"{target} exists with another report; nothing written")
    atomic_write_text(target, text, inputs=[args.report])
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "keep_report"))
