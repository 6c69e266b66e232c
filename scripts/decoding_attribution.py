#!/usr/bin/env python
"""Where beam decoding's time goes: the part an attention implementation owns, and the rest.

Runs fairseq-generate on the same binarized split for stock fairseq (the export to fairseq's
``transformer``, a process without the plugin) and for our checkpoint searching by stock's
rules (``--length-penalty-form fairseq --max-len-over-source -1``), alternating, each run in a
fresh process, with wall-clock timers wrapped around:

* the generation (fairseq's ``SequenceGenerator._generate``);
* every attention module (fairseq's ``MultiheadAttention``, ours ``MultiHeadAttention`` and
  its subclasses), and the ``nn.Linear`` projections inside them;
* the generator's reorders (``reorder_incremental_state``, ``reorder_encoder_out``).

*Attention-owned* is the attention modules less their projections, plus the reorders: what
another attention implementation could change. The *rest* (the generator's own work, the
encoder, embeddings, feed-forward layers, layer norms, the projections, the output layer) is the
same computation in both models, so stock's generation divided by our rest bounds the speed-up
any attention implementation could give in this generator. The timers add a little to both.

    DEMO=work_dirs/demo_multi30k
    python scripts/decoding_attribution.py --checkpoint $DEMO/base/average/checkpoint_avg.pt \\
        --builtin engines/builtin.pt --data-dir $DEMO/data-bin --repeats 2

``--builtin`` is the export ``vaswani-export CHECKPOINT --to fairseq`` writes (benchmark_engines.py
leaves one in its work directory).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
PARTS = ("generation", "attention", "projections", "reorders")
MARK = "ATTRIBUTION "
RUNS = ("stock", "ours")


# -- the worker: one fairseq-generate run with timers; imports nothing of the plugin itself ----


def _timed(totals: Dict[str, float], key: str, fn: Callable,
           active: Optional[Callable[[], bool]] = None) -> Callable:
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if active is None or active():
                totals[key] += time.perf_counter() - start
    return wrapper


def _attention_classes() -> tuple:
    from fairseq.modules import MultiheadAttention
    classes = [MultiheadAttention]
    ours = sys.modules.get("user_plugin.modules.attention")  # loaded by --user-dir, if given
    if ours is not None:
        classes.append(ours.MultiHeadAttention)
    return tuple(classes)


def worker(generate_argv: List[str]) -> None:
    """Run fairseq-generate with ``generate_argv`` and print the timers as one JSON line."""
    import torch.nn as nn
    from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
    from fairseq_cli import generate

    totals = dict.fromkeys(PARTS, 0.0)
    depth = [0]

    def instrument(model: nn.Module) -> None:
        attention_classes = _attention_classes()
        for module in model.modules():
            if isinstance(module, attention_classes):
                forward = module.forward

                def attention(*args, _forward=forward, **kwargs):
                    depth[0] += 1
                    try:
                        return _forward(*args, **kwargs)
                    finally:
                        depth[0] -= 1
                module.forward = _timed(totals, "attention", attention)
                for child in module.modules():
                    if isinstance(child, nn.Linear):
                        child.forward = _timed(totals, "projections", child.forward,
                                               lambda: depth[0] > 0)

    build = SequenceGenerator.__init__

    def init(self, models, *args, **kwargs):
        for model in models:
            instrument(model)
        build(self, models, *args, **kwargs)

    SequenceGenerator.__init__ = init
    SequenceGenerator._generate = _timed(totals, "generation", SequenceGenerator._generate)
    for name in ("reorder_incremental_state", "reorder_encoder_out"):
        setattr(EnsembleModel, name, _timed(totals, "reorders", getattr(EnsembleModel, name)))
    sys.argv = ["fairseq-generate", *generate_argv]
    generate.cli_main()
    print(MARK + json.dumps(totals), flush=True)


# -- the driver ---------------------------------------------------------------------------------


# each run as an engine of user_plugin.measurement.generate_runs
ENGINE_OF = {"stock": "builtin", "ours": "ours-fairseq-rules"}


def measure(run: str, args) -> Dict[str, float]:
    """One run in a fresh process (stock's without the plugin), one thread."""
    from user_plugin.files import UserError
    from user_plugin.measurement.generate_runs import generate_arguments, generate_environment

    engine = ENGINE_OF[run]
    model = args.builtin if run == "stock" else args.checkpoint
    argv = generate_arguments(engine, args.data_dir, model, args.subset, args.batch_size)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_worker", *argv,
                           "--quiet"], capture_output=True, text=True,
                          env=generate_environment(engine, threads=1), check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{run}: fairseq-generate failed: {tail}")
    totals = json.loads(lines[-1][len(MARK):])
    owned = totals["attention"] - totals["projections"] + totals["reorders"]
    return {**totals, "attention_owned": owned, "rest": totals["generation"] - owned}


def summarize(runs: Dict[str, List[Dict[str, float]]]) -> Dict[str, Any]:
    keys = (*PARTS, "attention_owned", "rest")
    summary: Dict[str, Any] = {
        run: {key: statistics.median(r[key] for r in values) for key in keys}
        for run, values in runs.items()
    }
    stock, ours = summary["stock"], summary["ours"]
    summary["speedup"] = stock["generation"] / ours["generation"]
    summary["bound_with_free_attention"] = stock["generation"] / ours["rest"]
    # what ours' attention-owned work may cost for a speed-up of 1.5x
    summary["owned_budget_for_1_5x"] = stock["generation"] / 1.5 - ours["rest"]
    return summary


def table(summary: Dict[str, Any]) -> str:
    rows = ["| run | generation | attention modules | their projections | reorders | "
            "attention-owned | rest |", "|" + " --- |" * 7]
    for run in RUNS:
        entry = summary[run]
        cells = [run] + [f"{entry[key]:.2f}" for key in
                         ("generation", "attention", "projections", "reorders",
                          "attention_owned", "rest")]
        rows.append("| " + " | ".join(cells) + " |")
    rows.append(f"\nours vs stock: {summary['speedup']:.2f}x; with attention-owned work free: "
                f"at most {summary['bound_with_free_attention']:.2f}x; 1.5x needs ours' "
                f"attention-owned work in {summary['owned_budget_for_1_5x']:.2f} s")
    return "\n".join(rows)


def main(argv: List[str] | None = None) -> int:
    import argparse

    from user_plugin.files import UserError, atomic_write_text
    from user_plugin.measurement.cpu import cpu_flags, cpu_name

    parser = argparse.ArgumentParser(prog="decoding_attribution.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="our checkpoint")
    parser.add_argument("--builtin", type=Path, required=True,
                        help="its export to fairseq's transformer (vaswani-export --to fairseq)")
    parser.add_argument("--data-dir", type=Path, required=True, help="the fairseq data-bin")
    parser.add_argument("--subset", default="test", help="binarized split decoded")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1:
        raise UserError("--repeats and --batch-size must be >= 1")
    for path in (args.checkpoint, args.builtin):
        if not path.is_file():
            raise UserError(f"{path}: no such model file")
    runs: Dict[str, List[Dict[str, float]]] = {run: [] for run in RUNS}
    for repeat in range(args.repeats):
        for run in (RUNS if repeat % 2 == 0 else RUNS[::-1]):
            result = measure(run, args)
            runs[run].append(result)
            print(f"repeat {repeat + 1}/{args.repeats} {run:5s} generation "
                  f"{result['generation']:.2f} s, attention-owned "
                  f"{result['attention_owned']:.2f} s, rest {result['rest']:.2f} s", flush=True)
    summary = summarize(runs)
    print("\n" + table(summary))
    if args.json_out:
        record = {"config": {key: str(value) for key, value in vars(args).items()},
                  "machine": {"cpu": cpu_name(), "cpu_flags": cpu_flags()},
                  "summary": summary, "runs": runs}
        atomic_write_text(args.json_out, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_worker":
        worker(sys.argv[2:])
        sys.exit(0)
    sys.path.insert(0, str(REPO))
    from user_plugin.files import run_main

    sys.exit(run_main(main, None, "decoding_attribution.py"))
