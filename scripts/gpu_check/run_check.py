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
    the device, in fp32, fp16, bf16 (weights) and bf16 autocast (the plugin's ``--bf16 --amp``):
    forward, incremental decoding, beam search, and the criterion with its fused loss; the
    float32-master optimizer against fairseq's ``FP16Optimizer`` and against float32 training.
``training``
    ``fairseq-train`` on Multi30k with ``vaswani_base`` in fp32, ``--fp16`` and ``--bf16``
    (float32 masters), ``--memory-efficient-fp16`` and ``--bf16 --amp`` (autocast),
    concurrently on the one GPU: the
    loss must fall, without a loss-scale loop; the run is stopped, resumed from
    ``checkpoint_last.pt`` to the end, and its checkpoint decoded by ``fairseq-generate``.
``decoding``
    ``fairseq-generate``, beam 4, on the Multi30k test set: ours (the fp32 run's checkpoint)
    against stock fairseq (the same weights exported with ``user_plugin.export --to fairseq``,
    decoded in a process without ``--user-dir``); sentences/s and identical hypotheses. With
    ``--sections demo,decoding`` it decodes the demo's trained model instead.
``speed``
    steady-state training throughput at about the paper's 25k target tokens per update, for
    base and big, on a synthetic corpus made here in seconds with WMT14 EN-DE's sentence
    lengths (``user_plugin/measurement/synthetic_corpus.py``; large enough that no epoch ends
    inside a window): stock fairseq (``transformer_wmt_en_de`` /
    ``transformer_vaswani_wmt_en_de_big`` with its own criterion and scheduler, ``--fp16``,
    in a process without the plugin) and each variant of ours (:data:`VARIANTS`). Every run is
    one ``fairseq-train`` process observed by ``user_plugin/measurement/train_step_probe.py``:
    60 updates of warm-up not counted, then 300 (base) / 150 (big) updates in intervals, each
    timed between two device synchronisations; the median interval's target tokens/s and the
    spread; MFU (``user_plugin/measurement/flops.py``); then, in the same process, a
    ``torch.profiler`` window of 3 updates (GPU-busy fraction, kernels and synchronisations
    per update, the top kernels, the attention backend of each attention call) and one update
    under ``torch.cuda.set_sync_debug_mode("warn")`` (every synchronisation, with its line,
    and whether it was inside the forward-backward pass).
``demo``
    the Multi30k demo's configuration (``recipes/demo_multi30k.sh``) trained with ``--bf16``,
    averaged, decoded with the paper's settings and scored with sacreBLEU; wall time.

Budgets (docs/gpu_check.md): ``speed`` for base and big with the core variants takes about
8 minutes (its default budget, 480 s); ``--variants all`` adds the compiled and autocast
variants.

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
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
KIT = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

from user_plugin import paper  # noqa: E402  (none of these imports torch or fairseq)
from user_plugin.measurement import flops  # noqa: E402
from user_plugin.training_log import read_training_log  # noqa: E402

PLUGIN = REPO / "user_plugin"
SECTIONS = ("equivalence", "training", "decoding", "speed", "demo")
PROBE = PLUGIN / "measurement" / "train_step_probe.py"
#: Dense bf16/fp16 tensor-core peak of the H100 and H200 (SXM) on paper, TFLOP/s.
PEAK_TFLOPS = 989.0

# The paper's optimisation (§5.3) and regularisation (§5.4), as the recipes pass them.
PAPER_OPTIMIZER = ["--optimizer", "adam", "--adam-betas", paper.adam_betas_option(),
                   "--adam-eps", str(paper.ADAM_EPS)]
SMOOTHING = ["--label-smoothing", str(paper.LABEL_SMOOTHING)]
DECODING = ["--beam", str(paper.BEAM), "--lenpen", str(paper.LENPEN)]
OURS = ["--user-dir", str(PLUGIN), "--lr", "1", "--lr-scheduler", "vaswani_inverse_sqrt",
        "--criterion", "vaswani_label_smoothed_cross_entropy", *SMOOTHING]
# Stock fairseq's own scheduler and criterion, with the paper's peak rate for base (7e-4 is
# what fairseq's WMT examples use; the paper's formula peaks at 6.99e-4).
STOCK = ["--lr", "7e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-7",
         "--criterion", "label_smoothed_cross_entropy", *SMOOTHING]
TINY_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
              "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4"]
DEMO_MODEL = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
              "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
              "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4", "--dropout", str(paper.DROPOUT),
              "--d-model", "256"]


@dataclass(frozen=True)
class SpeedSize:
    """One model size of the speed section and how its updates are made."""

    stock_arch: str
    our_arch: str
    layers: int
    d_model: int
    d_ff: int
    max_tokens: int  # per batch (source or target, padded)
    update_freq: int  # batches per update
    measured: int  # updates measured after the warm-up
    interval: int  # updates per timed interval


#: About 25k target tokens per update (the paper's 25k source + 25k target tokens per batch):
#: WMT's sources are the longer side here and fairseq's --max-tokens counts the longer side of
#: each padded batch, so ~29.5k of it hold ~25k target tokens; big takes two batches per update
#: to stay well inside an H100's memory with stock fairseq's float32 log-softmax.
SPEED_SIZES = {
    "base": SpeedSize("transformer_wmt_en_de", "vaswani_base", 6, 512, 2048, 29500, 1, 300, 50),
    "big": SpeedSize("transformer_vaswani_wmt_en_de_big", "vaswani_big", 6, 1024, 4096, 14750,
                     2, 150, 25),
}
TINY_SIZE = {"tiny": SpeedSize("transformer", "vaswani_base", 1, 32, 64, 800, 1, 4, 2)}
#: Updates of warm-up, not counted (CUDA and allocator warm-up, cuBLAS heuristics, compiles).
SPEED_WARMUP = 60
#: Updates profiled after the window, then one more under sync-debug mode.
PROFILED_UPDATES = 3
#: The variants of the speed section: (implementation, fairseq-train options). Ours use the
#: plugin's vaswani_adam (one fused update over the flat float32 masters).
VARIANTS = {
    "stock-fp16": ("stock", ["--fp16"]),
    "ours-bf16": ("ours", ["--bf16"]),
    "ours-fp16": ("ours", ["--fp16"]),
    "ours-bf16-compile": ("ours", ["--bf16", "--compile-layers",
                                   "--required-seq-len-multiple", "8"]),
    "ours-bf16-autocast": ("ours", ["--bf16", "--amp"]),
}
#: What one ~8-minute call measures; the rest when time is left or in another call.
CORE_VARIANTS = ("stock-fp16", "ours-bf16", "ours-fp16")
#: Paper's base schedule, for the projected training time: 100k updates (§5.3).
PAPER_UPDATES = 100_000
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"],
                   "memory_efficient_fp16": ["--memory-efficient-fp16"], "bf16": ["--bf16"],
                   "bf16_autocast": ["--bf16", "--amp"]}
TRANSLATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
                        r"\(([\d.]+) sentences/s")


class Settings:
    """Sizes of one run of the check: the real ones on a GPU, tiny ones for the CPU dry run."""

    def __init__(self, tiny: bool, device: str):
        self.tiny, self.device = tiny, device
        self.cpu_args = ["--cpu"] if device == "cpu" else []
        self.train_updates = (6, 12) if tiny else (150, 300)
        self.train_tokens = 600 if tiny else 4096
        self.train_model = TINY_MODEL if tiny else []
        self.speed_sizes = TINY_SIZE if tiny else SPEED_SIZES
        self.speed_warmup = 2 if tiny else SPEED_WARMUP
        self.speed_vocabulary = 800 if tiny else 32000
        self.demo_updates = 25 if tiny else 1800
        self.demo_model = TINY_MODEL + ["--d-model", "32"] if tiny else DEMO_MODEL
        self.demo_warmup = 10 if tiny else 800
        self.demo_save, self.demo_validate = (5, 10) if tiny else (100, 1000)
        self.equivalence_size = "tiny" if tiny else "small"
        # measured on one H200: equivalence 26 s, training 174 s (four runs at once), decoding
        # 54 s; the demo validates (beam search BLEU) at each of its 18 saves and ran 700 of
        # its 1,800 updates in 130 s; speed: estimated (docs/gpu_check.md), each run stops
        # where its budget ends and keeps the intervals it measured
        self.budgets = {"install": 60, "equivalence": 60,
                        "training": 300 if tiny else 240, "decoding": 120 if tiny else 70,
                        "speed": 600 if tiny else 480, "demo": 240 if tiny else 420}


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
                                       "tiny": args.tiny, "argv": sys.argv[1:],
                                       "sections": {}}
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
            # the fairseq export is laid out as stock fairseq's own checkpoints (an
            # argparse.Namespace), which stock fairseq reads under torch >= 2.6 only so
            env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
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
            "--path", save_dir / "checkpoint_last.pt", *DECODING,
            "--max-tokens", "8000", "--gen-subset", "test", "--post-process", "subword_nmt",
            *s.cpu_args, *(["--fp16"] if precision == "fp16" and not s.cpu_args else [])]),
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
        common = ["--beam", str(paper.BEAM), "--max-len-a", "1", "--max-len-b",
                  str(paper.MAX_LEN_OVER_SOURCE), "--max-tokens",
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
                  "precision": "fp32", "beam": paper.BEAM,
                  "stock_process": "fairseq-generate without --user-dir (no plugin)"}
        result["status"] = "passed" if same == len(hyps["stock"]) == len(hyps["ours"]) \
            else "failed"
        return result

    def speed_corpus(self) -> Dict[str, Any]:
        """The synthetic corpus with WMT14's lengths (made once per check), large enough for
        the longest run of the plan: its statistics."""
        from user_plugin.measurement import synthetic_corpus

        if getattr(self, "_speed_corpus", None) is not None:
            return self._speed_corpus
        s = self.settings
        pairs = synthetic_corpus.read_length_pairs(self.args.carry / "data"
                                                   / synthetic_corpus.LENGTHS_FILE)
        tokens_per_update = 25000 if not s.tiny else 800
        updates = max(s.speed_warmup + size.measured + PROFILED_UPDATES + 2
                      for size in s.speed_sizes.values())
        started = time.time()
        stats = synthetic_corpus.write_corpus(
            self.work / "wmt_synthetic", pairs,
            train_pairs=synthetic_corpus.pairs_for(tokens_per_update * updates, pairs),
            valid_pairs=100, vocabulary=s.speed_vocabulary)
        stats["seconds_to_make"] = round(time.time() - started, 1)
        self._speed_corpus = stats
        return stats

    def speed_args(self, variant: str, size_name: str) -> List[Any]:
        """The fairseq-train options of one speed run (the probe's come first)."""
        s = self.settings
        size = s.speed_sizes[size_name]
        impl, flags = VARIANTS[variant]
        last_measured = s.speed_warmup + size.measured
        profile_first = last_measured + 1
        sync_debug = profile_first + PROFILED_UPDATES
        name = f"speed-{size_name}-{variant}"
        probe = [PROBE, self.logs / f"{name}.probe.json",
                 "--window", f"{s.speed_warmup}:{size.interval}:{size.measured // size.interval}",
                 "--profile", f"{profile_first}:{PROFILED_UPDATES}",
                 "--profile-table", self.logs / f"{name}.profile.txt",
                 "--layers", f"{size.layers}:{size.layers}", "--sync-debug", sync_debug]
        if impl == "stock" and "--fp16" in flags and self.args.device == "cpu":
            probe.append("--fp16-masters-on-cpu")
        optimizer = PAPER_OPTIMIZER if impl == "stock" else \
            ["vaswani_adam" if arg == "adam" else arg for arg in PAPER_OPTIMIZER]
        train = [self.work / "wmt_synthetic", "--share-all-embeddings", *optimizer,
                 "--warmup-updates", str(paper.WARMUP_STEPS), "--max-tokens", size.max_tokens,
                 "--update-freq", size.update_freq, "--max-update", sync_debug,
                 "--no-save", "--disable-validation", "--log-format", "json",
                 "--log-interval", size.interval, "--seed", "1",
                 "--num-workers", "2" if not s.tiny else "0",
                 "--fp16-init-scale", "8" if self.args.device == "cpu" else "128",
                 *s.cpu_args, *flags, *(TINY_MODEL if s.tiny else [])]
        if impl == "stock":
            train = ["--arch", size.stock_arch, *STOCK, *train]
        else:
            train = ["--arch", size.our_arch, *OURS, *train]
        return [self.python, *probe, "--", "fairseq_cli.train", *train]

    def speed_plan(self) -> List[tuple]:
        """(size, variant) in the order they run, the most wanted first: stock fp16 and ours
        bf16 of each size, then the other core variants, then the extra ones."""
        chosen = self.args.variants
        sizes = list(self.settings.speed_sizes)
        first = [v for v in ("stock-fp16", "ours-bf16") if v in chosen]
        core = [v for v in CORE_VARIANTS if v in chosen and v not in first]
        extra = [v for v in chosen if v not in CORE_VARIANTS]
        return [(size, v) for size in sizes for v in first] + \
            [(size, v) for size in sizes for v in core] + \
            [(size, v) for size in sizes for v in extra]

    def section_speed(self, budget: float) -> Dict[str, Any]:
        s = self.settings
        started = time.time()
        stats = self.speed_corpus()
        counts = flops.TokenCounts(stats["source_tokens"], stats["target_tokens"],
                                   stats["source_squares"], stats["target_squares"],
                                   stats["source_target"])
        results: Dict[str, Any] = {
            "warmup_updates": s.speed_warmup,
            "measured_updates": {n: z.measured for n, z in s.speed_sizes.items()},
            "tokens_per_update": {n: {"max_tokens": z.max_tokens, "update_freq": z.update_freq}
                                  for n, z in s.speed_sizes.items()},
            "stock_process": "fairseq-train without --user-dir (no plugin), fairseq's "
                             "criterion and scheduler",
            "corpus": stats, "flops_formula": flops.FORMULA,
            "peak_tflops": PEAK_TFLOPS if self.args.device == "cuda" else None, "runs": {}}
        plan = self.speed_plan()
        for index, (size_name, variant) in enumerate(plan):
            name = f"speed-{size_name}-{variant}"
            remaining = budget - (time.time() - started)
            if remaining < 30:
                results["runs"][name] = {"status": "skipped", "reason": "out of time"}
                continue
            # the runs left share what remains; the first runs of the plan come first
            share = remaining if index == len(plan) - 1 else \
                max(remaining / (len(plan) - index) * 1.5, min(remaining, 90.0))
            run = self.command(name, self.speed_args(variant, size_name), share,
                               stock=VARIANTS[variant][0] == "stock")
            results["runs"][name] = self.speed_figures(name, size_name, variant, run, counts)
        for size_name in s.speed_sizes:
            stock = results["runs"].get(f"speed-{size_name}-stock-fp16", {})
            for variant in VARIANTS:
                ours = results["runs"].get(f"speed-{size_name}-{variant}", {})
                if variant != "stock-fp16" and stock.get("target_tokens_per_s") \
                        and ours.get("target_tokens_per_s"):
                    key = f"ratio_{size_name}_{variant.replace('-', '_')}_over_stock_fp16"
                    results[key] = ours["target_tokens_per_s"] / stock["target_tokens_per_s"]
        ran = [r for r in results["runs"].values() if r.get("status") != "skipped"]
        results["status"] = "passed" if ran and all(r["status"] == "passed" for r in ran) \
            else "failed"
        return results

    def speed_figures(self, name: str, size_name: str, variant: str, run: Dict[str, Any],
                      counts: "flops.TokenCounts") -> Dict[str, Any]:
        """One run's figures from its probe report (what it measured before any time limit)."""
        s = self.settings
        size = s.speed_sizes[size_name]
        probe_path = self.logs / f"{name}.probe.json"
        probe = json.loads(probe_path.read_text()) if probe_path.exists() else {}
        throughput = probe.get("throughput")
        if not throughput:
            return failed(run)
        shape = flops.TransformerShape(size.layers, size.layers, size.d_model, size.d_ff,
                                       s.speed_vocabulary)
        per_token = flops.training_flops_per_target_token(shape, counts)
        rate = throughput["median_target_tokens_per_s"]
        per_update = throughput["target_tokens_per_update"]
        complete = len(probe["intervals"]) * size.interval >= size.measured
        figures = {
            "size": size_name, "variant": variant, "impl": VARIANTS[variant][0],
            "options": VARIANTS[variant][1], "target_tokens_per_s": rate,
            "spread": throughput["spread"], "intervals": len(probe["intervals"]),
            "interval_rates": [round(i["target_tokens_per_s"]) for i in probe["intervals"]],
            "updates_measured": throughput["updates"], "target_tokens_per_update": per_update,
            "peak_memory_gib": probe.get("peak_memory_bytes", 0) / 2**30,
            "flops_per_target_token": per_token,
            "mfu": flops.mfu(rate, per_token, PEAK_TFLOPS * 1e12)
            if self.args.device == "cuda" else None,
            "paper_base_schedule_hours": PAPER_UPDATES * per_update / rate / 3600,
            "plugin_loaded": probe.get("plugin_loaded"), "seconds": run["seconds"],
            "exit": run["code"],
            "status": "passed" if complete and run["code"] == 0 else
            ("partial" if probe.get("intervals") else "failed"),
        }
        if "profile" in probe:
            profile = dict(probe["profile"])
            profile["top_kernels"] = profile["top_kernels"][:10]
            figures["profile"] = profile
        if "sync_debug" in probe:
            debug = probe["sync_debug"]
            figures["sync_debug"] = {
                "syncs": len(debug["warnings"]),
                "in_forward_backward": debug["in_forward_backward"],
                "where": sorted({w["where"] for w in debug["warnings"]})[:20]}
        if figures["status"] == "partial":
            figures["reason"] = f"time limit after {len(probe['intervals'])} intervals"
        return figures

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
            *DECODING, "--max-len-a", "1", "--max-len-b", str(paper.MAX_LEN_OVER_SOURCE),
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
    parser.add_argument("--variants", default=",".join(CORE_VARIANTS),
                        help="speed variants, or 'all' (default: the core ones: "
                             f"{', '.join(CORE_VARIANTS)}; all: {', '.join(VARIANTS)})")
    args = parser.parse_args(argv)
    args.variants = list(VARIANTS) if args.variants == "all" else \
        [v for v in args.variants.split(",") if v]
    unknown_variants = sorted(set(args.variants) - set(VARIANTS))
    if unknown_variants:
        parser.error(f"unknown variant(s) {unknown_variants}; choose from {', '.join(VARIANTS)}")
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    return Check(args).run(sections)


if __name__ == "__main__":
    sys.exit(main())
