"""A tiny model trained on text prepared by the recipes' own prepare step: what the text pipeline
and the shipping tests start from (raw text in, a model directory with its pipeline record
out)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import forked_cli
from cli import PAPER_OPTIMIZATION_ARGS, REPO, USER_DIR, run_fairseq

PREPARE = REPO / "recipes" / "steps" / "prepare.sh"

#: Model options of the tiny models (d_model 32, 2+2 layers, shared embeddings).
TINY_ARGS = [
    "--arch", "vaswani_base", "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0.1",
    "--share-all-embeddings",
]


def write_raw(raw_dir: Path, splits: dict[str, dict[str, list[str]]]) -> None:
    """The recipes' RAW_DIR layout: ``{split}.{lang}``, one sentence per line."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for split, sides in splits.items():
        for lang, lines in sides.items():
            (raw_dir / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_prepare(pair: str, raw_dir: Path, work_dir: Path, **settings: str) -> Path:
    """``recipes/steps/prepare.sh PAIR`` on ``raw_dir``; returns its output directory."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("WORK_DIR", "RAW_DIR", "BPE_OPS", "SPM_VOCAB", "TRAIN_LINES")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(WORK_DIR=str(work_dir), RAW_DIR=str(raw_dir), WORKERS="1",
               OMP_NUM_THREADS="1", **settings)
    proc = forked_cli.run(["bash", str(PREPARE), pair], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work_dir / "prepared"


def train_tiny(prep_dir: Path, root: Path, src: str, tgt: str, updates: int,
               extra: tuple[str, ...] = ()) -> SimpleNamespace:
    """Binarize ``prep_dir`` (joined dictionary) and train a tiny model for ``updates``
    updates; the checkpoint directory gets the pipeline record and subword model, as the
    recipes' average step gives the averaged model."""
    data_bin = root / "data-bin"
    run_fairseq("preprocess", [
        "--source-lang", src, "--target-lang", tgt, "--joined-dictionary",
        "--trainpref", prep_dir / "train", "--validpref", prep_dir / "valid",
        "--testpref", prep_dir / "test", "--destdir", data_bin, "--workers", "1",
    ])
    save_dir = root / "model"
    run_fairseq("train", [
        data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1", *TINY_ARGS, *extra,
        *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", str(max(updates // 2, 1)),
        "--max-tokens", "1500", "--max-update", str(updates), "--save-dir", save_dir,
        "--disable-validation", "--no-epoch-checkpoints", "--num-workers", "0",
        "--required-batch-size-multiple", "1", "--log-interval", "50",
    ], timeout=1800)
    record = prep_dir / "text_pipeline.json"
    subword_model = json.loads(record.read_text(encoding="utf-8"))["subword_model"]
    for name in ("text_pipeline.json", subword_model):
        shutil.copyfile(prep_dir / name, save_dir / name)
    return SimpleNamespace(prep_dir=prep_dir, data_bin=data_bin, model_dir=save_dir,
                           checkpoint=save_dir / "checkpoint_last.pt",
                           subword_model=subword_model)
