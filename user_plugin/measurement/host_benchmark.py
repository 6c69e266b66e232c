"""The host benchmark: ATen operators and host-device synchronisations per update of real
``fairseq-train`` processes, stock fairseq against the plugin, in every precision mode that
runs on a CPU (``scripts/benchmark_host.py`` is its command line).

Each run is one ``fairseq-train`` process observed by :mod:`.train_step_probe` (run as a file:
the stock process never loads the plugin). Both models have the same shape (6 + 6 layers by
default, tiny widths: operator counts do not depend on widths), the same synthetic corpus with
WMT14's sentence lengths (:mod:`.synthetic_corpus`), and dropout 0.1. Calls 3 to 5 of
``Trainer.train_step`` are counted (the first two create optimizer state), then averaged.

The runs:

* stock: ``--arch transformer`` with fairseq's ``adam``, ``label_smoothed_cross_entropy`` and
  ``inverse_sqrt``, in fp32, ``--fp16`` (fairseq's ``FP16Optimizer``: on a CPU its master
  weights are allocated on ``torch.cuda.current_device()``, answered by the probe; otherwise
  unchanged) and ``--memory-efficient-fp16``. fairseq's ``--bf16`` cannot run anywhere but a
  TPU (it turns ``--tpu`` on), so there is no stock bf16: ours in bf16 is compared with stock
  fp16, the mode it replaces;
* ours: ``--arch vaswani_base`` with the plugin's criterion and scheduler and ``vaswani_adam``,
  in fp32, ``--fp16`` and ``--bf16`` (float32 masters), ``--bf16 --amp`` (bfloat16 autocast),
  and ``--memory-efficient-fp16`` (with fairseq's ``adam``, which that mode needs).

A record per run, with exactly the keys progress is read from: ``impl``, ``precision``,
``ops_per_update``, ``view_ops_per_update``, ``syncs_per_update``,
``syncs_in_forward_backward``. Operator counts are deterministic; nothing here is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..files.errors import UserError
from ..paper import ADAM_EPS, DROPOUT, LABEL_SMOOTHING, WARMUP_STEPS, adam_betas_option
from . import synthetic_corpus

PROBE = Path(__file__).resolve().parent / "train_step_probe.py"
PLUGIN = Path(__file__).resolve().parents[1]
#: The keys of a record (progress is read from them: keep them stable).
RECORD_KEYS = ("impl", "precision", "ops_per_update", "view_ops_per_update",
               "syncs_per_update", "syncs_in_forward_backward")
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"],
                   "memory_efficient_fp16": ["--memory-efficient-fp16"],
                   "bf16": ["--bf16"], "bf16_autocast": ["--bf16", "--amp"]}
STOCK_TRAINING = ["--arch", "transformer", "--optimizer", "adam", "--lr", "7e-4",
                  "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-7",
                  "--criterion", "label_smoothed_cross_entropy"]
OUR_TRAINING = ["--arch", "vaswani_base", "--user-dir", str(PLUGIN), "--optimizer", "adam",
                "--lr", "1",
                "--lr-scheduler", "vaswani_inverse_sqrt",
                "--criterion", "vaswani_label_smoothed_cross_entropy"]
FIRST_COUNTED_CALL, COUNTED_CALLS = 3, 3


@dataclass(frozen=True)
class Run:
    impl: str  # "stock" or "ours"
    precision: str  # a key of PRECISION_FLAGS
    optimizer: str = "adam"

    @property
    def name(self) -> str:
        return f"{self.impl}-{self.precision}"


RUNS = (
    Run("stock", "fp32"), Run("stock", "fp16"), Run("stock", "memory_efficient_fp16"),
    Run("ours", "fp32", "vaswani_adam"), Run("ours", "fp16", "vaswani_adam"),
    Run("ours", "bf16", "vaswani_adam"), Run("ours", "bf16_autocast", "vaswani_adam"),
    Run("ours", "memory_efficient_fp16"),
)


def runs_named(names: Sequence[str]) -> List[Run]:
    """The runs of :data:`RUNS` called ``names`` (``stock-fp32``...); a one-line error names
    the known ones otherwise."""
    known = {run.name: run for run in RUNS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UserError(f"no run named {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[name] for name in names]


def model_args(layers: int, dim: int) -> List[str]:
    return ["--encoder-layers", str(layers), "--decoder-layers", str(layers),
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(2 * dim), "--decoder-ffn-embed-dim", str(2 * dim),
            "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
            "--share-all-embeddings", "--dropout", str(DROPOUT),
            "--label-smoothing", str(LABEL_SMOOTHING)]


def command(run: Run, data: Path, out: Path, layers: int, dim: int) -> List[str]:
    """The probe's command line for ``run``."""
    probe = [sys.executable, str(PROBE), str(out),
             "--count-operators", f"{FIRST_COUNTED_CALL}:{COUNTED_CALLS}"]
    if run.impl == "stock" and run.precision == "fp16":
        probe.append("--fp16-masters-on-cpu")
    training = STOCK_TRAINING if run.impl == "stock" else OUR_TRAINING
    training = [run.optimizer if arg == "adam" else arg for arg in training]
    last = FIRST_COUNTED_CALL + COUNTED_CALLS - 1
    return [*probe, "--", "fairseq_cli.train", str(data), "--cpu", *training,
            *model_args(layers, dim), *PRECISION_FLAGS[run.precision],
            "--adam-betas", adam_betas_option(), "--adam-eps", str(ADAM_EPS),
                "--warmup-updates", str(WARMUP_STEPS),
            # a small initial loss scale: no overflow in the counted calls (stock fairseq's
            # overflow handling needs CUDA)
            "--fp16-init-scale", "8", "--max-tokens", "1024", "--max-update", str(last),
            "--required-batch-size-multiple", "1", "--num-workers", "0", "--seed", "1",
            "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "100"]


def make_corpus(directory: Path, lengths: Path) -> None:
    """The synthetic corpus of the runs: 3,000 pairs with WMT14's lengths, 8,000 types."""
    pairs = synthetic_corpus.read_length_pairs(lengths) if lengths.suffix == ".json" else \
        synthetic_corpus.length_pairs(lengths / "newstest2014.en", lengths / "newstest2014.de")
    synthetic_corpus.write_corpus(directory, pairs, train_pairs=3000, valid_pairs=50,
                                  vocabulary=8000)


def run_all(lengths: Path, work_dir: Optional[Path] = None, layers: int = 6, dim: int = 32,
            runs: Sequence[Run] = RUNS, log: Callable[[str], None] = print
            ) -> Tuple[List[Dict], Dict[str, Dict]]:
    """Every run: the records (:data:`RECORD_KEYS`) and each run's full probe report.

    ``lengths``: newstest2014 EN-DE's folder, or a JSON table of length pairs
    (:func:`.synthetic_corpus.write_length_pairs`).
    """
    if not lengths.exists():
        raise UserError(f"{lengths}: no newstest2014 EN-DE (the sentence lengths of the "
                        "corpus); set --lengths")
    with tempfile.TemporaryDirectory(prefix="vaswani-host-benchmark-",
                                     dir=work_dir) as temp:
        temp_dir = Path(temp)
        data = temp_dir / "data"
        make_corpus(data, lengths)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)
        records, reports = [], {}
        for run in runs:
            out = temp_dir / f"{run.name}.json"
            proc = subprocess.run(command(run, data, out, layers, dim), cwd=temp_dir, env=env,
                                  capture_output=True, text=True)
            report = json.loads(out.read_text()) if out.exists() else {}
            figures = report.get("operators")
            if proc.returncode != 0 or figures is None:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                raise UserError(f"the {run.name} run failed (exit {proc.returncode}): "
                                + " | ".join(tail))
            if report["plugin_loaded"] != (run.impl == "ours"):
                loaded = "did not load" if run.impl == "ours" else "loaded"
                raise UserError(f"the {run.name} run {loaded} the plugin")
            record = {"impl": run.impl, "precision": run.precision}
            record.update({key: figures[key] for key in RECORD_KEYS[2:]})
            records.append(record)
            reports[run.name] = {"optimizer": run.optimizer, **figures}
            log(f"{run.name:28s} ops {record['ops_per_update']:8.1f}  views "
                f"{record['view_ops_per_update']:8.1f}  syncs {record['syncs_per_update']:5.1f}"
                f"  in forward/backward {record['syncs_in_forward_backward']:5.1f}")
    return records, reports


def ratios(records: Sequence[Dict]) -> Dict[str, Dict[str, float]]:
    """Ours over stock per precision (bf16 modes over stock fp16, which they replace)."""
    stock = {r["precision"]: r for r in records if r["impl"] == "stock"}
    result = {}
    for record in records:
        if record["impl"] != "ours":
            continue
        baseline = stock.get(record["precision"]) or stock.get("fp16")
        if baseline:
            result[record["precision"]] = {
                "against": f"stock {baseline['precision']}",
                "ops": record["ops_per_update"] / baseline["ops_per_update"],
                "view_ops": record["view_ops_per_update"] / baseline["view_ops_per_update"]}
    return result
