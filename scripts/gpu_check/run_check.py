#!/usr/bin/env python
"""The GPU check: the plugin where users train, in one command, against stock fairseq.

Run on the GPU machine from the repository root, with ``.gpu_carry/`` (made here by
``scripts/gpu_check/build_carry.py``) carried along::

    python3 scripts/gpu_check/run_check.py --out "$OUT"

It installs the carried wheels into a temporary directory (no network there), then runs each
section in its own processes, under its own time budget; a failing section is reported and the
next one runs. After every section ``OUT/gpu_report.json`` (every figure, the device name, torch
and CUDA versions) and ``OUT/gpu_check.log`` are rewritten, and ``OUT/logs.tar.gz`` holds each
command's output, so that a run cut short still reports what it measured.

Sections:

``equivalence``
    ``equivalence.py``: our model against fairseq's ``transformer`` with the same weights, on
    the device, in fp32, fp16, bf16 (weights) and bf16 autocast (the plugin's ``--bf16``):
    forward, incremental decoding, beam search, and the criterion with its fused loss.
``training``
    ``fairseq-train`` on Multi30k with ``vaswani_base`` in fp32, ``--fp16``,
    ``--memory-efficient-fp16`` and the plugin's ``--bf16``, concurrently on the one GPU: the
    loss must fall, without a loss-scale loop; the run is stopped, resumed from
    ``checkpoint_last.pt`` to the end, and its checkpoint decoded by ``fairseq-generate``.
``decoding``
    ``fairseq-generate``, beam 4, on the Multi30k test set: ours (the fp32 run's checkpoint)
    against stock fairseq (the same weights exported with ``user_plugin.export --to fairseq``,
    decoded in a process without ``--user-dir``); sentences/s and identical hypotheses. With
    ``--sections demo,decoding`` it decodes the demo's trained model instead.
``speed``
    training throughput at about the paper's 25k tokens per step, for base and big: stock
    fairseq (``transformer_wmt_en_de`` / ``transformer_vaswani_wmt_en_de_big`` with its own
    criterion and scheduler, in a process without the plugin) in fp16, ours in fp16 and bf16:
    target tokens/s, peak memory and MFU (:func:`training_flops_per_target_token`).
``profile``
    ``torch.profiler`` over five training steps of base: stock fp16, ours fp16 and bf16; the
    operator tables (by device time, by host time) are in the logs, the top rows in the report.
``demo``
    the Multi30k demo's configuration (``recipes/demo_multi30k.sh``) trained with ``--bf16``,
    averaged, decoded with the paper's settings and scored with sacreBLEU; wall time.

Measured on one H200 (docs/gpu_check.md): the first four sections take about 7 minutes and
the demo about 6, so one session's 15 minutes of device time holds them as two calls made back
to back (``--sections equivalence,training,decoding,speed``, then ``--sections demo``), or the
sections a previous session left unmeasured.

``--device cpu --tiny`` runs the same sections with tiny models and few updates on a CPU with
the current environment (``--no-install``): the test suite does this so that the check cannot
rot between GPU sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
KIT = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

from user_plugin.files import UserError  # noqa: E402  (neither imports torch or fairseq)
from user_plugin.training_log import read_training_log  # noqa: E402

PLUGIN = REPO / "user_plugin"
SECTIONS = ("equivalence", "training", "decoding", "speed", "profile", "demo")
#: Dense bf16/fp16 tensor-core peak of the H100 and H200 (SXM) on paper, TFLOP/s.
PEAK_TFLOPS = 989.0

# The paper's optimisation (§5.3) and regularisation (§5.4), as the recipes pass them.
PAPER_OPTIMIZER = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-9"]
#: Our runs of the speed section, once per optimizer: fairseq's adam (a Python loop over the
#: parameter tensors without apex) and the plugin's vaswani_adam (multi-tensor operations).
OUR_OPTIMIZERS = ("adam", "vaswani_adam")
OURS = ["--user-dir", str(PLUGIN), "--lr", "1", "--lr-scheduler", "vaswani_inverse_sqrt",
        "--criterion", "vaswani_label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
# Stock fairseq's own scheduler and criterion, with the paper's peak rate for base (7e-4 is
# what fairseq's WMT examples use; the paper's formula peaks at 6.99e-4).
STOCK = ["--lr", "7e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-7",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
TINY_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
              "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4"]
DEMO_MODEL = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
              "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
              "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4", "--dropout", "0.1", "--d-model", "256"]
#: (stock arch, our arch, layers, d_model, d_ff) for the speed section.
SPEED_SIZES = {"base": ("transformer_wmt_en_de", "vaswani_base", 6, 512, 2048),
               "big": ("transformer_vaswani_wmt_en_de_big", "vaswani_big", 6, 1024, 4096)}
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"],
                   "memory_efficient_fp16": ["--memory-efficient-fp16"], "bf16": ["--bf16"]}
TRANSLATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
                        r"\(([\d.]+) sentences/s")


def speed_run_name(size: str, impl: str, precision: str, optimizer: str) -> str:
    """``speed-SIZE-IMPL-PRECISION``, with ``-OPTIMIZER`` when it is not fairseq's adam."""
    suffix = "" if optimizer == "adam" else f"-{optimizer}"
    return f"speed-{size}-{impl}-{precision}{suffix}"


class Settings:
    """Sizes of one run of the check: the real ones on a GPU, tiny ones for the CPU dry run."""

    def __init__(self, tiny: bool, device: str):
        self.tiny, self.device = tiny, device
        self.cpu_args = ["--cpu"] if device == "cpu" else []
        self.train_updates = (6, 12) if tiny else (150, 300)
        self.train_tokens = 600 if tiny else 4096
        self.train_model = TINY_MODEL if tiny else []
        self.speed_sizes = {"tiny": ("transformer", "vaswani_base", 1, 32, 64)} if tiny \
            else SPEED_SIZES
        self.speed_tokens = 800 if tiny else 25000
        # the first interval (CUDA and allocator warm-up, cuBLAS heuristics) is not counted
        self.speed_updates, self.speed_interval = (6, 2) if tiny else (80, 20)
        self.speed_precisions = (["fp32"], ["fp32", "bf16"]) if device == "cpu" \
            else (["fp16"], ["fp16", "bf16"])
        self.demo_updates = 25 if tiny else 1800
        self.demo_model = TINY_MODEL + ["--d-model", "32"] if tiny else DEMO_MODEL
        self.demo_warmup = 10 if tiny else 800
        self.demo_save, self.demo_validate = (5, 10) if tiny else (100, 1000)
        self.equivalence_size = "tiny" if tiny else "small"
        # measured on one H200: equivalence 26 s, training 174 s (four runs at once), decoding
        # 54 s, speed 130 s for three base runs at 30 updates (now five runs per size at 80
        # updates: base's five fit in about 300 s, big gets the rest); the demo validates
        # (beam search BLEU) at each of its 18 saves and ran 700 of its 1,800 updates in 130 s
        self.budgets = {"install": 60, "equivalence": 60,
                        "training": 240 if tiny else 200, "decoding": 120 if tiny else 70,
                        "speed": 300 if tiny else 420, "profile": 120 if tiny else 150,
                        "demo": 240 if tiny else 420}


class Check:
    """Runs the sections, keeps the report and the logs, writes them after each section."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.settings = Settings(args.tiny, args.device)
        self.out = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="vaswani-gpu-check-"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.data = args.carry / "data" / "multi30k"
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.python = sys.executable
        self.deadline = time.time() + args.budget
        self.report: Dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                 time.gmtime()),
                                       "tiny": args.tiny, "sections": {}}
        self.lines: List[str] = []

    # ---------------------------------------------------------------------------------------
    # bookkeeping

    def say(self, message: str) -> None:
        line = f"[gpu_check {time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        report = self.out / "gpu_report.json"
        tmp = report.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        os.replace(tmp, report)
        (self.out / "gpu_check.log").write_text("\n".join(self.lines) + "\n")
        with tarfile.open(self.out / "logs.tar.gz.tmp", "w:gz") as archive:
            archive.add(self.logs, arcname="logs")
        os.replace(self.out / "logs.tar.gz.tmp", self.out / "logs.tar.gz")

    def command(self, name: str, argv: Sequence[Any], timeout: float,
                stock: bool = False) -> Dict[str, Any]:
        """Run one command; its output goes to logs/NAME.log. ``stock``: a process that cannot
        import the plugin (the repository is not on its path)."""
        env = dict(self.env)
        if stock:
            env["PYTHONPATH"] = self.site_path()
        log = self.logs / f"{name}.log"
        start = time.time()
        timeout = max(1.0, min(timeout, self.deadline - time.time()))
        with open(log, "w", encoding="utf-8") as handle:
            handle.write("$ " + " ".join(map(str, argv)) + "\n")
            handle.flush()
            try:
                code = subprocess.run([str(a) for a in argv], stdout=handle,
                                      stderr=subprocess.STDOUT, env=env, cwd=self.work,
                                      timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        return {"name": name, "code": code, "seconds": round(time.time() - start, 2),
                "output": log.read_text(encoding="utf-8", errors="replace")}

    def site_path(self) -> str:
        return self.env.get("VASWANI_CHECK_SITE", "")

    def fairseq(self, module: str, args: Sequence[Any]) -> List[Any]:
        return [self.python, "-m", f"fairseq_cli.{module}", *args]

    def measured(self, name: str, module: str, args: Sequence[Any]) -> List[Any]:
        return [self.python, KIT / "measure.py", self.logs / f"{name}.memory.json",
                f"fairseq_cli.{module}", *args]

    # ---------------------------------------------------------------------------------------
    # set-up

    def install(self) -> None:
        """Install the carried wheels into a temporary site directory (no network)."""
        problems = subprocess.run(
            [self.python, KIT / "build_carry.py", "--carry", self.args.carry, "--check"],
            capture_output=True, text=True)
        if problems.returncode != 0:
            raise SystemExit(f"run_check: error: {problems.stderr.strip()}")
        if self.args.no_install:
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(REPO), self.env.get("PYTHONPATH", "")) if p)
            return
        site = self.work / "site"
        wheels = sorted((self.args.carry / "wheels").glob("*.whl"))
        result = self.command("install", [self.python, "-m", "pip", "install", "-q",
                                          "--no-index", "--no-deps", "--no-compile",
                                          "--target", site, *wheels],
                              self.settings.budgets["install"])
        if result["code"] != 0:
            raise SystemExit(f"run_check: error: installing the carried wheels failed: "
                             f"{result['output'][-500:]}")
        self.env["VASWANI_CHECK_SITE"] = str(site)
        self.env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
        sys.path.insert(0, str(site))  # corpus_statistics reads the data with fairseq here

    def environment(self) -> Dict[str, Any]:
        probe = ("import json, torch, fairseq, platform; d = torch.cuda.is_available(); "
                 "print(json.dumps({'python': platform.python_version(), "
                 "'torch': torch.__version__, 'cuda': torch.version.cuda, "
                 "'fairseq': fairseq.__version__, "
                 "'device': torch.cuda.get_device_name() if d else 'cpu', "
                 "'gpu_memory_gib': round(torch.cuda.get_device_properties(0).total_memory "
                 "/ 2**30, 1) if d else None, 'peak_tflops_reference': "
                 f"{PEAK_TFLOPS} if d else None}}))")
        result = self.command("environment", [self.python, "-c", probe], 120)
        if result["code"] != 0:
            raise SystemExit(f"run_check: error: the environment probe failed: "
                             f"{result['output'][-800:]}")
        return json.loads(result["output"].strip().splitlines()[-1])

    # ---------------------------------------------------------------------------------------
    # sections

    def section_equivalence(self, budget: float) -> Dict[str, Any]:
        result = self.command("equivalence", [
            self.python, KIT / "equivalence.py", "--device", self.args.device,
            "--size", self.settings.equivalence_size], budget)
        if result["code"] != 0:
            return failed(result)
        report = json.loads(result["output"].strip().splitlines()[-1])
        report["status"] = "passed" if report["passed"] else "failed"
        return report

    def train_args(self, save_dir: Path, precision: str, updates: int) -> List[Any]:
        s = self.settings
        return [self.data, "--arch", "vaswani_base", "--share-all-embeddings", *s.train_model,
                *PAPER_OPTIMIZER, *OURS, "--warmup-updates", "100" if not s.tiny else "4",
                "--max-tokens", s.train_tokens, "--max-update", updates, "--seed", "1",
                "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation",
                "--log-format", "json", "--log-interval", "2" if s.tiny else "25",
                "--required-batch-size-multiple", "1", "--num-workers", "0",
                *s.cpu_args, *PRECISION_FLAGS[precision]]

    def train_one(self, precision: str, budget: float) -> Dict[str, Any]:
        s = self.settings
        if precision == "fp16" and self.args.device == "cpu":
            return {"status": "skipped", "reason": "--fp16 needs CUDA (FP16Optimizer)"}
        save_dir = self.work / "train" / precision
        first, last = s.train_updates
        started = time.time()
        runs = []
        for phase, updates in (("start", first), ("resume", last)):
            remaining = budget - (time.time() - started)
            runs.append(self.command(f"train-{precision}-{phase}",
                                     self.fairseq("train", self.train_args(save_dir, precision,
                                                                           updates)),
                                     remaining))
            if runs[-1]["code"] != 0:
                return failed(runs[-1])
        logs = [read_training_log(self.logs / f"train-{precision}-{phase}.log")
                for phase in ("start", "resume")]
        losses = [v for log in logs for v in log.series("train", "loss").values]
        scales = [v for log in logs for v in log.series("train", "loss_scale").values]
        resumed = re.search(r"loaded checkpoint .*\(epoch \d+ @ (\d+) updates\)",
                            runs[1]["output"], re.IGNORECASE)
        overflows = sum(o["output"].count("gradient overflow detected") for o in runs)
        generate = self.command(f"generate-{precision}", self.fairseq("generate", [
            self.data, "--user-dir", PLUGIN, "--task", "vaswani_translation",
            "--path", save_dir / "checkpoint_last.pt", "--beam", "4", "--lenpen", "0.6",
            "--max-tokens", "8000", "--gen-subset", "test", "--post-process", "subword_nmt",
            *s.cpu_args, *(["--fp16"] if precision == "fp16" else [])]),
            budget - (time.time() - started))
        decoded = TRANSLATED.search(generate["output"])
        figures = {
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "updates": [first, last],
            "resumed_at_update": int(resumed.group(1)) if resumed else None,
            "overflows": overflows, "min_loss_scale": min(scales) if scales else None,
            "generate_sentences": int(decoded.group(1).replace(",", "")) if decoded else None,
            "generate_bleu_line": next((line for line in generate["output"].splitlines()
                                        if "BLEU" in line and "Generate" in line), None),
            "seconds": round(time.time() - started, 1),
        }
        figures["passed"] = {
            "loss_falls": bool(losses) and losses[-1] < losses[0] - 0.5,
            "no_loss_scale_loop": overflows <= max(2, last // 10),
            "resumed": figures["resumed_at_update"] == first,
            "generate_decodes": generate["code"] == 0 and decoded is not None,
        }
        figures["status"] = "passed" if all(figures["passed"].values()) else "failed"
        return figures

    def section_training(self, budget: float) -> Dict[str, Any]:
        precisions = list(PRECISION_FLAGS)
        workers = len(precisions) if self.args.device == "cuda" else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = dict(zip(precisions, pool.map(lambda p: self.train_one(p, budget),
                                                    precisions)))
        ran = [r for r in results.values() if r.get("status") != "skipped"]
        return {"runs": results, "concurrent": workers > 1,
                "status": "passed" if ran and all(r["status"] == "passed" for r in ran)
                else "failed"}

    def section_decoding(self, budget: float) -> Dict[str, Any]:
        started = time.time()
        # the demo's averaged model when the demo ran first (a trained model: real output
        # lengths), else the training section's fp32 model (mechanics only)
        candidates = [self.work / "demo" / "checkpoint_avg.pt",
                      self.work / "train" / "fp32" / "checkpoint_last.pt"]
        ours_checkpoint = next((c for c in candidates if c.exists()), None)
        if ours_checkpoint is None:
            return {"status": "skipped",
                    "reason": "no checkpoint from the demo or the training section"}
        stock_checkpoint = self.work / "decode" / "stock.pt"
        stock_checkpoint.parent.mkdir(parents=True, exist_ok=True)
        export = self.command("export-fairseq", [
            self.python, "-m", "user_plugin.export", ours_checkpoint, "--data-dir", self.data,
            "--to", "fairseq", "--output", stock_checkpoint], budget)
        if export["code"] != 0:
            return failed(export)
        common = ["--beam", "4", "--max-len-a", "1", "--max-len-b", "50", "--max-tokens",
                  "8000", "--gen-subset", "test", "--required-batch-size-multiple", "1",
                  *self.settings.cpu_args]
        runs = {}
        for impl in ("stock", "ours"):
            base = impl.split("_")[0]
            args = [self.data, "--path", stock_checkpoint if base == "stock" else ours_checkpoint,
                    *common]
            if base == "ours":
                args = [*args, "--user-dir", PLUGIN, "--task", "translation"]
            runs[impl] = self.command(f"decode-{impl}", self.fairseq("generate", args),
                                      budget - (time.time() - started), stock=base == "stock")
            if runs[impl]["code"] != 0:
                return failed(runs[impl])
        hyps = {impl: hypotheses(run["output"]) for impl, run in runs.items()}
        speed = {impl: float(TRANSLATED.search(run["output"]).group(4))
                 for impl, run in runs.items()}
        same = sum(hyps["ours"].get(i) == h for i, h in hyps["stock"].items())
        result = {"model": str(ours_checkpoint.relative_to(self.work)),
                  "output_tokens": sum(len(h.split()) for h in hyps["ours"].values()),
                  "sentences": len(hyps["stock"]), "identical_hypotheses": same,
                  "sentences_per_s": speed, "ratio_ours_over_stock": speed["ours"] / speed["stock"],
                  "precision": "fp32", "beam": 4,
                  "stock_process": "fairseq-generate without --user-dir (no plugin)"}
        result["status"] = "passed" if same == len(hyps["stock"]) == len(hyps["ours"]) \
            else "failed"
        return result

    def speed_args(self, impl: str, size: str, precision: str,
                   optimizer: str = "adam") -> List[Any]:
        s = self.settings
        stock_arch, our_arch, *_ = s.speed_sizes[size]
        paper_optimizer = [optimizer if arg == "adam" else arg for arg in PAPER_OPTIMIZER]
        args = [self.data, "--share-all-embeddings", *paper_optimizer,
                "--warmup-updates", "4000", "--max-tokens", s.speed_tokens,
                "--max-update", s.speed_updates, "--no-save", "--disable-validation",
                "--log-format", "json", "--log-interval", s.speed_interval, "--seed", "1",
                "--num-workers", "2" if not s.tiny else "0", *s.cpu_args,
                *PRECISION_FLAGS[precision]]
        if impl == "stock":
            return ["--arch", stock_arch, *STOCK, *args,
                    *(TINY_MODEL if s.tiny else [])]
        return ["--arch", our_arch, *OURS, *args, *(TINY_MODEL if s.tiny else [])]

    def section_speed(self, budget: float) -> Dict[str, Any]:
        s = self.settings
        started = time.time()
        stats = corpus_statistics(self.data)
        results: Dict[str, Any] = {"tokens_per_step": s.speed_tokens, "updates": s.speed_updates,
                                   "excluded_first_updates": s.speed_interval,
                                   "stock_process": "fairseq-train without --user-dir "
                                                    "(no plugin), fairseq's criterion and "
                                                    "scheduler", "data": stats, "runs": {}}
        stock_precisions, our_precisions = s.speed_precisions
        plan = [(size, "stock", p, "adam") for size in s.speed_sizes for p in stock_precisions]
        plan += [(size, "ours", p, o) for size in s.speed_sizes for p in our_precisions
                 for o in OUR_OPTIMIZERS]
        plan.sort(key=lambda item: list(s.speed_sizes).index(item[0]))
        for size, impl, precision, optimizer in plan:
            name = speed_run_name(size, impl, precision, optimizer)
            remaining = budget - (time.time() - started)
            if remaining < 20:
                results["runs"][name] = {"status": "skipped", "reason": "out of time"}
                continue
            run = self.command(name, self.measured(name, "train", self.speed_args(
                impl, size, precision, optimizer)), remaining, stock=impl == "stock")
            if run["code"] != 0:
                results["runs"][name] = failed(run)
                continue
            try:
                series = read_training_log(self.logs / f"{name}.log").series("train", "wps")
            except UserError as error:
                results["runs"][name] = {"status": "failed", "error": str(error)}
                continue
            counted = [v for u, v in zip(series.updates, series.values) if u > s.speed_interval]
            memory = json.loads((self.logs / f"{name}.memory.json").read_text())
            wps = statistics.mean(counted) if counted else None
            _, _, layers, dim, ffn = s.speed_sizes[size]
            flops = training_flops_per_target_token(layers, dim, ffn, stats)
            results["runs"][name] = {
                "size": size, "impl": impl, "precision": precision, "optimizer": optimizer,
                "target_tokens_per_s": wps, "peak_memory_gib": memory["peak_bytes"] / 2**30,
                "flops_per_target_token": flops,
                "mfu": wps * flops / (PEAK_TFLOPS * 1e12)
                if wps and self.args.device == "cuda" else None,
                "seconds": run["seconds"], "status": "passed" if wps else "failed",
            }
        for size in s.speed_sizes:
            stock = results["runs"].get(f"speed-{size}-stock-{stock_precisions[0]}", {})
            for precision in our_precisions:
                for optimizer in OUR_OPTIMIZERS:
                    name = speed_run_name(size, "ours", precision, optimizer)
                    ours = results["runs"].get(name, {})
                    if stock.get("target_tokens_per_s") and ours.get("target_tokens_per_s"):
                        key = name.replace("speed-", "ratio_").replace("-", "_")
                        results[f"{key}_over_stock_{stock_precisions[0]}"] = (
                            ours["target_tokens_per_s"] / stock["target_tokens_per_s"])
        ran = [r for r in results["runs"].values() if r.get("status") != "skipped"]
        results["status"] = "passed" if ran and all(r["status"] == "passed" for r in ran) \
            else "failed"
        return results

    def section_profile(self, budget: float) -> Dict[str, Any]:
        """Where a training step's time goes: ``torch.profiler`` over a few steps of base, stock
        fp16 and ours in each precision; the operator tables go to logs/ and the report keeps
        the top rows."""
        s = self.settings
        first, count = (3, 2) if s.tiny else (25, 5)
        size = next(iter(s.speed_sizes))
        started = time.time()
        results: Dict[str, Any] = {"steps": [first, first + count - 1], "size": size}
        stock_precisions, our_precisions = s.speed_precisions
        plan = [("stock", p) for p in stock_precisions] + [("ours", p) for p in our_precisions]
        for impl, precision in plan:
            name = f"profile-{size}-{impl}-{precision}"
            table = self.logs / f"{name}.txt"
            remaining = budget - (time.time() - started)
            if remaining < 20:
                results[name] = {"status": "skipped", "reason": "out of time"}
                continue
            args = self.speed_args(impl, size, precision)
            args[args.index("--max-update") + 1] = str(first + count)
            self.env["VASWANI_PROFILE"] = f"{table}:{first}:{count}"
            try:
                run = self.command(name, self.measured(name, "train", args), remaining,
                                   stock=impl == "stock")
            finally:
                del self.env["VASWANI_PROFILE"]
            if run["code"] != 0 or not table.exists():
                results[name] = failed(run)
                continue
            results[name] = {"status": "passed",
                             "top": table.read_text(encoding="utf-8").splitlines()[:16]}
        ran = [r for k, r in results.items() if isinstance(r, dict) and "status" in r]
        results["status"] = "passed" if ran and all(r["status"] in ("passed", "skipped")
                                                     for r in ran) else "failed"
        return results

    def section_demo(self, budget: float) -> Dict[str, Any]:
        s = self.settings
        started = time.time()
        save_dir = self.work / "demo"
        train = self.command("demo-train", self.fairseq("train", [
            self.data, "--arch", "vaswani_base", "--share-all-embeddings", *s.demo_model,
            *PAPER_OPTIMIZER, *OURS, "--task", "vaswani_translation",
            "--warmup-updates", s.demo_warmup, "--max-tokens", "2048", "--update-freq", "1",
            "--required-batch-size-multiple", "1", "--max-update", s.demo_updates, "--seed", "1",
            "--save-dir", save_dir, "--save-interval-updates", s.demo_save,
            "--keep-interval-updates", "5", "--no-epoch-checkpoints",
            "--validate-interval-updates", s.demo_validate, "--validate-interval", "1000",
            "--eval-bleu", "--eval-bleu-args", '{"beam":4,"lenpen":0.6}', "--eval-bleu-remove-bpe",
            "--eval-bleu-detok", "moses", "--eval-bleu-detok-args", '{"target_lang":"de"}',
            "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
            "--log-format", "json", "--log-interval", "50" if not s.tiny else "5",
            "--num-workers", "2" if not s.tiny else "0", "--bf16", *s.cpu_args]), budget)
        if train["code"] != 0:
            return failed(train)
        trained = time.time() - started
        average = save_dir / "checkpoint_avg.pt"
        avg = self.command("demo-average", [
            self.python, "-m", "user_plugin.commands.average_checkpoints", "--inputs", save_dir,
            "--num-update-checkpoints", "5", "--output", average],
            budget - (time.time() - started))
        if avg["code"] != 0:
            return failed(avg)
        generate = self.command("demo-generate", self.fairseq("generate", [
            self.data, "--user-dir", PLUGIN, "--task", "vaswani_translation", "--path", average,
            "--beam", "4", "--lenpen", "0.6", "--max-len-a", "1", "--max-len-b", "50",
            "--max-tokens", "8000", "--gen-subset", "test", "--post-process", "subword_nmt",
            "--required-batch-size-multiple", "1", *s.cpu_args]),
            budget - (time.time() - started))
        if generate["code"] != 0:
            return failed(generate)
        hyps = hypotheses(generate["output"])
        bleu = sacrebleu_of(hyps, self.data / "test.raw.de")
        last_loss = read_training_log(self.logs / "demo-train.log").series("train",
                                                                         "loss").last()
        return {"status": "passed" if bleu is not None else "failed",
                "updates": s.demo_updates, "precision": "bf16 (the plugin's autocast)",
                "train_seconds": round(trained, 1),
                "wall_seconds": round(time.time() - started, 1),
                "sacrebleu": bleu, "test_sentences": len(hyps),
                "last_train_loss": last_loss[1] if last_loss else None}

    # ---------------------------------------------------------------------------------------

    def run(self, sections: Sequence[str]) -> int:
        self.say(f"work directory {self.work}; budget {self.args.budget:.0f} s")
        self.install()
        self.report["environment"] = self.environment()
        self.say(f"environment: {self.report['environment']}")
        self.save()
        for name in sections:
            remaining = self.deadline - time.time()
            budget = min(self.settings.budgets[name], remaining)
            if budget < 15:
                self.report["sections"][name] = {"status": "skipped", "reason": "out of time"}
                self.say(f"{name}: skipped (out of time)")
                continue
            self.say(f"{name}: starting (budget {budget:.0f} s)")
            started = time.time()
            try:
                result = getattr(self, f"section_{name}")(budget)
            except Exception as error:  # a section's own bug must not hide the others' figures
                result = {"status": "error", "error": f"{type(error).__name__}: {error}"}
            result["section_seconds"] = round(time.time() - started, 1)
            self.report["sections"][name] = result
            self.say(f"{name}: {result['status']} in {result['section_seconds']} s")
            self.save()
        self.report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        statuses = [r["status"] for r in self.report["sections"].values()]
        self.say("summary: " + ", ".join(f"{n} {r['status']}"
                                         for n, r in self.report["sections"].items()))
        self.save()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        return 0 if all(s in ("passed", "skipped") for s in statuses) else 1


def failed(result: Dict[str, Any]) -> Dict[str, Any]:
    return {"status": "failed", "command": result["name"], "exit": result["code"],
            "seconds": result["seconds"], "output_tail": result["output"][-1500:]}


def hypotheses(output: str) -> Dict[int, str]:
    """fairseq-generate's best hypothesis per sentence id (``H-<id>`` lines)."""
    found = {}
    for line in output.splitlines():
        if line.startswith("H-"):
            head, _score, text = (line.split("\t") + ["", ""])[:3]
            found.setdefault(int(head[2:]), text)
    return found


def sacrebleu_of(hyps: Dict[int, str], reference: Path) -> Optional[float]:
    """Detokenized (Moses) hypotheses against the raw reference, sacreBLEU's defaults."""
    import sacrebleu
    from sacremoses import MosesDetokenizer

    refs = reference.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        return None
    detok = MosesDetokenizer(lang="de")
    lines = [detok.detokenize(hyps[i].split()) for i in range(len(refs))]
    return round(sacrebleu.corpus_bleu(lines, [refs]).score, 2)


def corpus_statistics(data: Path) -> Dict[str, float]:
    """Token counts of the training split (with EOS), for the FLOP count: totals and the
    length-weighted mean length sum(L^2) / sum(L) that attention's cost follows."""
    from fairseq.data import Dictionary, data_utils

    stats: Dict[str, float] = {}
    for side, lang in (("source", "en"), ("target", "de")):
        dictionary = Dictionary.load(str(data / f"dict.{lang}.txt"))
        dataset = data_utils.load_indexed_dataset(str(data / f"train.en-de.{lang}"), dictionary)
        sizes = dataset.sizes.astype("float64")
        stats[f"{side}_tokens"] = float(sizes.sum())
        stats[f"{side}_attention_length"] = float((sizes ** 2).sum() / sizes.sum())
    stats["source_per_target"] = stats["source_tokens"] / stats["target_tokens"]
    stats["vocabulary"] = len(dictionary)
    return stats


def training_flops_per_target_token(layers: int, d: int, ffn: int,
                                    stats: Dict[str, float]) -> float:
    """Model FLOPs of one training step per target token (forward + backward = 3 x forward;
    a multiply-add counts 2; no recomputation):

    encoder, per source token and layer: 8 d^2 (Q, K, V, output projections)
        + 4 d d_ff (feed-forward) + 4 d L_s (Q K^T and A V over L_s keys);
    decoder, per target token and layer: 8 d^2 (self-attention projections)
        + 4 d^2 (encoder-decoder Q and output projections) + 4 d d_ff
        + 4 d L_t (self-attention, full L_t x L_t as the kernels compute it) + 4 d L_s;
        per source token and decoder layer: 4 d^2 (encoder-decoder K, V projections);
    output projection: 2 d V per target token.

    L_s, L_t are the length-weighted mean lengths sum(L^2)/sum(L) of the data; source tokens
    per target token from the data too. The embedding lookups are not counted.
    """
    ls, lt = stats["source_attention_length"], stats["target_attention_length"]
    ratio, vocab = stats["source_per_target"], stats["vocabulary"]
    encoder = layers * (8 * d * d + 4 * d * ffn + 4 * d * ls)
    decoder = layers * (12 * d * d + 4 * d * ffn + 4 * d * lt + 4 * d * ls)
    cross_kv = layers * 4 * d * d
    forward = ratio * (encoder + cross_kv) + decoder + 2 * d * vocab
    return 3.0 * forward


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    parser.add_argument("--carry", type=Path, default=REPO / ".gpu_carry")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU dry run)")
    parser.add_argument("--no-install", action="store_true",
                        help="use this environment's fairseq instead of the carried wheels")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for all the sections asked for")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    return Check(args).run(sections)


if __name__ == "__main__":
    sys.exit(main())
