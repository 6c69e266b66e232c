#!/usr/bin/env python
"""Benchmark the engines a trained model can be served with, on one test set.

Engines, all decoding the same binarized test sentences with beam 4 and alpha 0.6 (§6.1):

* ``ours``: ``fairseq-generate --user-dir user_plugin --task vaswani_translation`` on our
  checkpoint: the exact paper decoder (GNMT penalty, each output at most its source + 50);
* ``builtin``: stock ``fairseq-generate`` (no ``--user-dir``) on the export to fairseq's
  ``transformer`` (``vaswani-export --to fairseq``): fairseq's ``|Y|^alpha``
  penalty and its batch-wide ``--max-len-a 1 --max-len-b 50``, what stock fairseq serves;
* ``ours-fairseq-rules``: our checkpoint and plugin decoding by ``builtin``'s rules
  (``--length-penalty-form fairseq --max-len-over-source -1`` and the same ``--max-len-a/b``):
  the same search as stock, so the same hypotheses, and its speed-up is the model's and the
  plugin's alone;
* ``ct2-float32`` and ``ct2-int8``: the CTranslate2 exports (``--to ctranslate2``), decoded by
  the hub's ``ctranslate2`` backend (GNMT re-ranking of the beam, per-sentence limit).

Each measurement runs in a fresh process with 1 or more threads (``OMP_NUM_THREADS`` for
fairseq, CTranslate2's ``intra_threads``); the engines' order rotates on every repeat and the
medians are reported, with the load average around each run. Time covers decoding only:
fairseq-generate's own generation timer, and the hub's ``translate_tokens`` call. Reported per
engine and thread count: sentences/s, target tokens/s (with EOS, as fairseq counts), speed-up
over ``builtin``; per engine: sacreBLEU of the detokenized output against the reference
(BPE removed and Moses-detokenized by the hub's text codec, the same for every engine) and the
share of sentences whose hypothesis equals the exact decoder's (``ours``) and, for the engines
that search as stock does, the share equal to ``builtin``'s.

The exports are written into ``--work-dir`` and reused when present.

    DEMO=work_dirs/demo_multi30k
    python scripts/benchmark_engines.py --checkpoint $DEMO/base/average/checkpoint_avg.pt \\
        --data-dir $DEMO/data-bin --bpe-codes $DEMO/prepared/bpe.codes \\
        --reference ../shared/data/multi30k-en-de/test_2016_flickr.de \\
        --work-dir work_dirs/engines --threads 1,2 --repeats 3 --json-out engines.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import UserError, atomic_write_text, read_lines, run_main  # noqa: E402
from user_plugin.measurement.cpu import cpu_flags, cpu_name  # noqa: E402
from user_plugin.measurement.generate_runs import (  # noqa: E402
    generate_arguments,
    generate_environment,
)
from user_plugin.paper import BEAM, LENPEN  # noqa: E402

ENGINES = ("builtin", "ours", "ours-fairseq-rules", "ct2-float32", "ct2-int8")
# engines whose search is stock fairseq's, whose hypotheses are compared with builtin's
STOCK_RULES = ("builtin", "ours-fairseq-rules")
# what each run keeps per sentence, for the agreement figures; the JSON leaves it out
PER_SENTENCE = ("hypotheses", "scores")
TRANSLATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmark_engines.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="our checkpoint")
    parser.add_argument("--data-dir", type=Path, required=True, help="its fairseq data-bin")
    parser.add_argument("--subset", default="test", help="binarized split decoded")
    parser.add_argument("--reference", type=Path, required=True,
                        help="raw (detokenized) reference translations of the split")
    parser.add_argument("--bpe-codes", type=Path, help="subword-nmt codes of the model")
    parser.add_argument("--sentencepiece-model", type=Path)
    parser.add_argument("--work-dir", type=Path, required=True, help="exports and outputs")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    return parser


# -- exports and inputs ------------------------------------------------------------------------


def is_older(path: Path, than: Path) -> bool:
    return path.stat().st_mtime < than.stat().st_mtime


def ensure_exports(args) -> dict[str, Path]:
    """The built-in and CTranslate2 exports of ``--checkpoint`` in ``--work-dir``, made when
    missing or older than the checkpoint."""
    from user_plugin.artifacts.manifest import MANIFEST
    from user_plugin.export.ctranslate2_model import export_ctranslate2
    from user_plugin.export.fairseq_checkpoint import export_fairseq_checkpoint

    paths = {"builtin": args.work_dir / "builtin.pt", "ours": args.checkpoint,
             "ours-fairseq-rules": args.checkpoint,
             "ct2-float32": args.work_dir / "ct2-float32", "ct2-int8": args.work_dir / "ct2-int8"}
    if not paths["builtin"].is_file() or is_older(paths["builtin"], args.checkpoint):
        print(f"exporting to fairseq's transformer: {paths['builtin']}", flush=True)
        export_fairseq_checkpoint(args.checkpoint, args.data_dir, paths["builtin"])
    for quantization in ("float32", "int8"):
        directory = paths[f"ct2-{quantization}"]
        if not (directory / MANIFEST).is_file() or is_older(directory / MANIFEST,
                                                             args.checkpoint):
            print(f"exporting to CTranslate2 ({quantization}): {directory}", flush=True)
            export_ctranslate2(args.checkpoint, args.data_dir, directory,
                               quantization=quantization, bpe_codes=args.bpe_codes,
                               sentencepiece_model=args.sentencepiece_model)
    return paths


def source_lines(data_dir: Path, subset: str) -> list[str]:
    """The binarized ``subset``'s source sentences as model token strings (without EOS), in
    order: exactly what fairseq-generate decodes."""
    from fairseq.data import Dictionary, data_utils

    src, _ = data_utils.infer_language_pair(str(data_dir))
    dictionary = Dictionary.load(str(data_dir / f"dict.{src}.txt"))
    prefixes = sorted(data_dir.glob(f"{subset}.*.{src}.idx"))
    if not prefixes:
        raise UserError(f"{data_dir}: no binarized {subset} split")
    dataset = data_utils.load_indexed_dataset(str(prefixes[0])[: -len(".idx")], dictionary)
    return [dictionary.string(dataset[i][:-1]) for i in range(len(dataset))]


# -- one measurement, in its own process -------------------------------------------------------


def fairseq_generate(engine: str, path: Path, args, threads: int) -> dict[str, Any]:
    """Time fairseq-generate (its generation timer) on ``path``; hypotheses by sentence id."""
    command = [sys.executable, "-m", "fairseq_cli.generate",
               *generate_arguments(engine, args.data_dir, path, args.subset, args.batch_size)]
    env = dict(generate_environment(engine, threads), PYTHONPATH=str(REPO))
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = TRANSLATED.search(proc.stderr + proc.stdout)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{engine}: fairseq-generate failed: {tail}")
    hypotheses: dict[int, tuple[str, float]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            head, score, tokens = line[2:].split("\t", 2)
            # fairseq-generate prints scores in base 2
            hypotheses.setdefault(int(head), (tokens, float(score) * math.log(2)))
    sentences, tokens, seconds = (found.group(1), found.group(2), found.group(3))
    best = [hypotheses[i] for i in range(len(hypotheses))]
    return {"sentences": int(sentences.replace(",", "")), "tokens": int(tokens.replace(",", "")),
            "seconds": float(seconds), "hypotheses": [tokens for tokens, _ in best],
            "scores": [score for _, score in best]}


def ctranslate2_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in a fresh process: load an export with ``threads`` and time ``translate_tokens``."""
    from user_plugin.hub.ctranslate2_translator import CTranslate2Translator, open_export

    engine, codec, manifest = open_export(spec["directory"], threads=spec["threads"])
    translator = CTranslate2Translator(engine, codec, manifest, beam=BEAM, lenpen=LENPEN,
                                       batch_size=spec["batch_size"])
    lines = read_lines(spec["lines"])
    start = time.perf_counter()
    hypos = translator.translate_tokens(lines)
    seconds = time.perf_counter() - start
    best = [per_line[0]["tokens"] for per_line in hypos]
    return {"sentences": len(lines), "seconds": seconds,
            "tokens": sum(len(tokens.split()) + 1 for tokens in best), "hypotheses": best,
            "scores": [per_line[0]["score"] for per_line in hypos]}


def ctranslate2_run(engine: str, directory: Path, lines_file: Path, args,
                    threads: int) -> dict[str, Any]:
    spec = {"directory": str(directory), "lines": str(lines_file), "threads": threads,
            "batch_size": args.batch_size}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, __file__, "--_ct2-worker", json.dumps(spec)],
                          capture_output=True, text=True, env=env, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{engine}: CTranslate2 run failed: {tail}")
    return json.loads(lines[-1])


def measure(engine: str, paths: dict[str, Path], lines_file: Path, args,
            threads: int) -> dict[str, Any]:
    """One timed run of ``engine``, with the load average before and after it."""
    load_before = os.getloadavg()[0]
    if engine.startswith("ct2"):
        result = ctranslate2_run(engine, paths[engine], lines_file, args, threads)
    else:
        result = fairseq_generate(engine, paths[engine], args, threads)
    result["load"] = (load_before, os.getloadavg()[0])
    result["sentences_per_s"] = result["sentences"] / result["seconds"]
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    return result


# -- quality ----------------------------------------------------------------------------------


def sacrebleu_of(hypotheses: list[str], references: list[str], codec) -> dict[str, Any]:
    """sacreBLEU of the token hypotheses, decoded to text by ``codec``, against the raw
    references."""
    import sacrebleu

    detokenized = [codec.decode(tokens) for tokens in hypotheses]
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(detokenized, [references])
    return {"score": score.score, "signature": str(bleu.get_signature())}


def agreement(run: dict, exact: dict) -> dict[str, Any]:
    """Share of sentences whose hypothesis equals the exact decoder's, and where they differ,
    how much better the exact decoder's pick scores (each engine's own score of its pick, in
    nats; meaningful for engines ranking by the same GNMT penalty): near-ties have gaps near
    zero."""
    differ = [i for i, (a, b) in enumerate(zip(run["hypotheses"], exact["hypotheses"]))
              if a != b]
    gaps = sorted(exact["scores"][i] - run["scores"][i] for i in differ)
    return {"share": 1 - len(differ) / len(exact["hypotheses"]), "differ": len(differ),
            "score_gap_median": statistics.median(gaps) if gaps else 0.0,
            "score_gap_max": max(gaps) if gaps else 0.0}


# -- report -----------------------------------------------------------------------------------


def summarize(runs: dict[str, dict[int, list[dict]]], engines: Sequence[str],
              thread_counts: Sequence[int], references: list[str], codec) -> dict[str, Any]:
    exact = runs["ours"][thread_counts[0]][0] if "ours" in runs else None
    summary: dict[str, Any] = {}
    for engine in engines:
        first = runs[engine][thread_counts[0]][0]
        entry: dict[str, Any] = {"bleu": sacrebleu_of(first["hypotheses"], references, codec)}
        if exact is not None:
            entry["agreement_with_exact"] = agreement(first, exact)
        if engine in STOCK_RULES and "builtin" in runs:
            entry["agreement_with_builtin"] = agreement(first, runs["builtin"][thread_counts[0]][0])
        for threads in thread_counts:
            values = runs[engine][threads]
            entry[f"threads_{threads}"] = {
                key: statistics.median(run[key] for run in values)
                for key in ("sentences_per_s", "tokens_per_s", "seconds")
            }
            entry[f"threads_{threads}"]["load"] = [run["load"] for run in values]
        summary[engine] = entry
    if "builtin" in summary:
        for engine in engines:
            for threads in thread_counts:
                mine = summary[engine][f"threads_{threads}"]
                mine["speedup_over_builtin"] = (
                    mine["sentences_per_s"]
                    / summary["builtin"][f"threads_{threads}"]["sentences_per_s"])
                # each repeat against the built-in's run of the same repeat: the machine's
                # speed drifts between repeats more than within one
                mine["speedup_by_repeat"] = [
                    run["sentences_per_s"] / stock["sentences_per_s"]
                    for run, stock in zip(runs[engine][threads], runs["builtin"][threads])]
    return summary


def _spread(ratios: Sequence[float]) -> str:
    """``min-max (median x)`` of per-repeat ratios; empty without any."""
    if not ratios:
        return ""
    return f"{min(ratios):.2f}-{max(ratios):.2f} ({statistics.median(ratios):.2f}x)"


def markdown(summary: dict[str, Any], thread_counts: Sequence[int]) -> str:
    header = ["engine"]
    for threads in thread_counts:
        header += [f"sentences/s ({threads}t)", f"tokens/s ({threads}t)",
                   f"vs built-in ({threads}t)", f"repeat by repeat ({threads}t)"]
    header += ["sacreBLEU", "= exact decoder", "= built-in"]
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for engine, entry in summary.items():
        cells = [engine]
        for threads in thread_counts:
            run = entry[f"threads_{threads}"]
            cells += [f"{run['sentences_per_s']:.1f}", f"{run['tokens_per_s']:,.0f}",
                      f"{run.get('speedup_over_builtin', float('nan')):.2f}x",
                      _spread(run.get("speedup_by_repeat", []))]
        cells.append(f"{entry['bleu']['score']:.2f}")
        for key in ("agreement_with_exact", "agreement_with_builtin"):
            share = entry.get(key)
            cells.append("" if share is None else f"{share['share']:.1%}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    from user_plugin.hub.ctranslate2_translator import open_export

    args = build_parser().parse_args(argv)
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown or not engines:
        raise UserError(f"--engines: choose among {', '.join(ENGINES)}")
    try:
        thread_counts = [int(n) for n in args.threads.split(",") if n.strip()]
    except ValueError:
        raise UserError(f"--threads: comma-separated integers, got {args.threads!r}") from None
    if not thread_counts or min(thread_counts) < 1 or args.repeats < 1:
        raise UserError("--threads and --repeats must be >= 1")
    references = read_lines(args.reference)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    paths = ensure_exports(args)
    lines = source_lines(args.data_dir, args.subset)
    if len(lines) != len(references):
        raise UserError(f"{args.reference}: {len(references)} lines, but the {args.subset} "
                        f"split has {len(lines)} sentences")
    lines_file = args.work_dir / f"{args.subset}.tokens.txt"
    atomic_write_text(lines_file, "\n".join(lines) + "\n")
    _, codec, _ = open_export(paths["ct2-float32"], bpe_codes=args.bpe_codes,
                              sentencepiece_model=args.sentencepiece_model)
    runs: dict[str, dict[int, list[dict]]] = {e: {t: [] for t in thread_counts} for e in engines}
    for repeat in range(args.repeats):
        shift = repeat % len(engines)
        order = engines[shift:] + engines[:shift]
        for threads in thread_counts:
            for engine in order:
                result = measure(engine, paths, lines_file, args, threads)
                runs[engine][threads].append(result)
                print(f"repeat {repeat + 1}/{args.repeats} threads {threads} {engine:12s} "
                      f"{result['sentences_per_s']:8.1f} sentences/s "
                      f"{result['tokens_per_s']:9.1f} tokens/s  load "
                      f"{result['load'][0]:.1f}->{result['load'][1]:.1f}", flush=True)
    summary = summarize(runs, engines, thread_counts, references, codec)
    table = markdown(summary, thread_counts)
    print("\n" + table)
    results = {"config": {key: str(value) for key, value in vars(args).items()},
               "machine": {"cpu": cpu_name(), "cpu_flags": cpu_flags(),
                           "cpu_count": os.cpu_count(), "load_after": os.getloadavg()},
               "summary": summary,
               "runs": {engine: {str(threads): [{k: v for k, v in run.items()
                                                 if k not in PER_SENTENCE} for run in values]
                                 for threads, values in by_threads.items()}
                        for engine, by_threads in runs.items()}}
    if args.json_out:
        atomic_write_text(args.json_out, json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json_out}")
    if args.markdown_out:
        atomic_write_text(args.markdown_out, table + "\n")
        print(f"wrote {args.markdown_out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_ct2-worker":
        print(json.dumps(ctranslate2_worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(run_main(main, None, "benchmark_engines.py"))
