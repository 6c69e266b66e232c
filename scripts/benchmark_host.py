#!/usr/bin/env python
"""Count, in real ``fairseq-train`` processes on this CPU, the ATen operators per update
(compute and views apart) and the host-device synchronisations of stock fairseq and of the
plugin, in every precision mode that runs on a CPU (``user_plugin/measurement/host_benchmark.py``
says what runs). Counts, does not time: any machine gives the same figures.

    python scripts/benchmark_host.py --json-out FILE

FILE: a JSON list of records ``{"impl", "precision", "ops_per_update", "view_ops_per_update",
"syncs_per_update", "syncs_in_forward_backward"}``, one per run. ``--details FILE`` adds each
run's most frequent operators and where its synchronisations were called. A few minutes on
two cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from user_plugin.files import run_main  # noqa: E402
from user_plugin.files.atomic import atomic_write_text  # noqa: E402
from user_plugin.measurement import host_benchmark  # noqa: E402

NEWSTEST = REPO.parent / "shared" / "data" / "newstest2014-en-de"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", type=Path, required=True)
    parser.add_argument("--details", type=Path, help="also write each run's full counts here")
    parser.add_argument("--lengths", type=Path, default=NEWSTEST,
                        help="newstest2014 EN-DE's folder, or a JSON table of length pairs")
    parser.add_argument("--layers", type=int, default=6, help="layers per stack (6)")
    parser.add_argument("--dim", type=int, default=32, help="d_model of both models (32)")
    parser.add_argument("--runs", default=",".join(run.name for run in host_benchmark.RUNS),
                        help="which runs, by name (default: all)")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = host_benchmark.runs_named(args.runs.split(","))
    records, reports = host_benchmark.run_all(args.lengths, args.work_dir, args.layers,
                                              args.dim, runs)
    atomic_write_text(args.json_out, json.dumps(records, indent=1) + "\n")
    for precision, ratio in host_benchmark.ratios(records).items():
        print(f"ours {precision} / {ratio['against']}: operators {ratio['ops']:.2f}x, "
              f"views {ratio['view_ops']:.2f}x")
    if args.details:
        atomic_write_text(args.details, json.dumps(reports, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "benchmark_host"))
