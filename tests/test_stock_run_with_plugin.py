"""A stock fairseq run in a process that loaded the plugin behaves as stock fairseq.

``--user-dir user_plugin`` installs the patch table in the whole process. The rows that change
what a run computes or writes apply to runs of our model or task only
(:mod:`user_plugin.fairseq_patches.scope`); the others only turn fairseq's crashes into results
or one error line. So ``--arch transformer --task translation`` with fairseq's own criterion and
scheduler, trained and decoded by the real command lines with ``--user-dir`` and without it,
gives the same checkpoints (top-level entries, parameter names, every weight bit for bit, the
optimizer state), the same losses and the same hypotheses; and the same stock model trained with
the plugin's criterion and scheduler (what a stock run loads the plugin for) writes checkpoints
with stock fairseq's entries and none of the plugin's (no training fingerprint), and no
progress line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import USER_DIR, fairseq_env, hypotheses, json_log_records, run_fairseq

from user_plugin.paper import BEAM, LABEL_SMOOTHING, LENPEN

STOCK_MODEL = [
    "--arch", "transformer", "--task", "translation",
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--dropout", "0.1",
]
STOCK_TRAINING = [
    "--optimizer", "adam", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "4", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", str(LABEL_SMOOTHING),
]
OUR_PARTS = [
    "--optimizer", "adam", "--lr", "1", "--lr-scheduler", "vaswani_inverse_sqrt",
    "--warmup-updates", "4", "--criterion", "vaswani_label_smoothed_cross_entropy",
    "--label-smoothing", str(LABEL_SMOOTHING),
]
UPDATES = 8


def train(data_bin: Path, save_dir: Path, plugin: bool, parts: list) -> str:
    args = [data_bin, *(["--user-dir", USER_DIR] if plugin else []), "--cpu", "--seed", "1",
            *STOCK_MODEL, *parts, "--max-tokens", "1500", "--max-update", str(UPDATES),
            "--save-interval-updates", "4", "--save-dir", save_dir, "--log-format", "json",
            "--log-interval", "2", "--required-batch-size-multiple", "1", "--num-workers", "0"]
    proc = run_fairseq("train", args)
    return proc.stdout + proc.stderr


def generate(data_bin: Path, checkpoint: Path, plugin: bool) -> dict:
    """fairseq-generate's best hypotheses. Stock fairseq 0.12 cannot read its own
    ``transformer`` checkpoints under torch's safe loading (their ``cfg.model`` is an
    ``argparse.Namespace``; the plugin allow-lists it), so the stock run loads them as torch
    did before safe loading became its default."""
    args = [data_bin, *(["--user-dir", USER_DIR] if plugin else []), "--cpu", "--path",
            checkpoint, "--task", "translation", "--gen-subset", "test", "--beam", str(BEAM),
            "--lenpen", str(LENPEN), "--batch-size", "16", "--max-len-b", "20",
            "--required-batch-size-multiple", "1"]
    env = {**fairseq_env(), **({} if plugin else {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})}
    proc = forked_cli.run([sys.executable, "-m", "fairseq_cli.generate", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return hypotheses(proc.stdout)


def configuration(state: dict, save_dir: Path) -> str:
    """A checkpoint's configuration in words, its save directory and ``--user-dir`` left out."""
    return repr(state["cfg"]).replace(str(save_dir), "SAVE_DIR").replace(repr(USER_DIR), "None")


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def runs(multi30k_bin, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("stock_run")
    out = {}
    for name, plugin, parts in (("stock", False, STOCK_TRAINING),
                                ("with_plugin", True, STOCK_TRAINING),
                                ("with_our_parts", True, OUR_PARTS)):
        save_dir = root / name
        out[name] = {"dir": save_dir,
                     "log": train(multi30k_bin.data_bin, save_dir, plugin, parts)}
    return out


def test_a_stock_run_writes_the_same_checkpoints_with_the_plugin_loaded(runs):
    stock, plugged = runs["stock"], runs["with_plugin"]
    names = sorted(p.name for p in stock["dir"].iterdir())
    assert names == sorted(p.name for p in plugged["dir"].iterdir())
    assert "checkpoint_last.pt" in names and "checkpoint_1_8.pt" in names
    for name in names:
        ours, theirs = load(plugged["dir"] / name), load(stock["dir"] / name)
        assert sorted(ours) == sorted(theirs), name
        assert list(ours["model"]) == list(theirs["model"]), name
        for key, tensor in theirs["model"].items():
            assert torch.equal(ours["model"][key], tensor), (name, key)
        history = [{k: v for k, v in h.items() if k != "lr_scheduler_state"}
                   for h in ours["optimizer_history"]]
        assert history == [{k: v for k, v in h.items() if k != "lr_scheduler_state"}
                           for h in theirs["optimizer_history"]], name
        for key, value in theirs["last_optimizer_state"]["state"].items():
            mine = ours["last_optimizer_state"]["state"][key]
            assert all(torch.equal(mine[k], v) for k, v in value.items()
                       if isinstance(v, torch.Tensor)), (name, key)
        # the configuration differs only in naming the plugin directory and the save directory
        assert configuration(ours, plugged["dir"]) == configuration(theirs, stock["dir"]), name


def test_a_stock_run_logs_the_same_losses_and_no_line_of_the_plugin(runs):
    stock, plugged = runs["stock"]["log"], runs["with_plugin"]["log"]
    for tag in ("train_inner", "valid"):
        theirs = [{k: v for k, v in r.items() if k in ("loss", "nll_loss", "lr", "num_updates")}
                  for r in json_log_records(stock, tag)]
        ours = [{k: v for k, v in r.items() if k in ("loss", "nll_loss", "lr", "num_updates")}
                for r in json_log_records(plugged, tag)]
        assert theirs and ours == theirs, tag
    for log in (plugged, runs["with_our_parts"]["log"]):
        assert "| progress |" not in log and "took over the lock" not in log
        assert "user_plugin.fairseq_patches" not in log


def test_a_stock_model_with_our_criterion_and_scheduler_writes_stock_checkpoints(runs):
    stock = load(runs["stock"]["dir"] / "checkpoint_last.pt")
    ours = load(runs["with_our_parts"]["dir"] / "checkpoint_last.pt")
    assert sorted(ours) == sorted(stock) and "training_data" not in ours
    assert list(ours["model"]) == list(stock["model"])
    assert all(ours["model"][k].dtype == v.dtype for k, v in stock["model"].items())
    assert ours["cfg"]["criterion"]["_name"] == "vaswani_label_smoothed_cross_entropy"


def test_a_stock_checkpoint_decodes_the_same_with_the_plugin_loaded(multi30k_bin, runs):
    checkpoint = runs["stock"]["dir"] / "checkpoint_last.pt"
    stock = generate(multi30k_bin.data_bin, checkpoint, plugin=False)
    plugged = generate(multi30k_bin.data_bin, checkpoint, plugin=True)
    assert len(stock) == 100 and plugged == stock
