"""Two-process data-parallel training on CPU (gloo) with our model, criterion and scheduler,
then a two-process resume: fairseq's distributed path, including the state that rank 0
broadcasts on resume, loads under torch's safe loading."""

import socket
import subprocess
import sys

import torch
from cli import (
    PAPER_OPTIMIZATION_ARGS,
    TINY_MODEL_ARGS,
    USER_DIR,
    fairseq_env,
    json_log_records,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_two_processes(data_bin, save_dir, max_update: int):
    port = free_port()
    procs = []
    for rank in (0, 1):
        cmd = [
            sys.executable, "-m", "fairseq_cli.train", str(data_bin), "--user-dir", USER_DIR,
            "--cpu", "--seed", "1", *TINY_MODEL_ARGS, *PAPER_OPTIMIZATION_ARGS,
            "--warmup-updates", "10", "--lr-scale", "0.5", "--max-tokens", "800",
            "--max-update", str(max_update), "--save-dir", str(save_dir),
            "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "2",
            "--required-batch-size-multiple", "1", "--num-workers", "0",
            "--distributed-world-size", "2", "--distributed-rank", str(rank),
            "--distributed-init-method", f"tcp://127.0.0.1:{port}",
            "--distributed-backend", "gloo", "--distributed-no-spawn",
            "--ddp-backend", "legacy_ddp",
        ]
        procs.append(subprocess.Popen(cmd, env=fairseq_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        outputs.append(out)
        assert proc.returncode == 0, out[-4000:]
    return outputs


def test_two_process_training_and_resume(multi30k_bin, tmp_path):
    save_dir = tmp_path / "ddp"
    first = train_two_processes(multi30k_bin.data_bin, save_dir, max_update=8)
    records = json_log_records(first[0], "train_inner")
    assert records and int(records[-1]["num_updates"]) == 8, first[0][-3000:]
    # with two workers, each update sums both ranks' sentences
    assert "distributed init (rank 1)" in first[0] + first[1]
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 8
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2

    second = train_two_processes(multi30k_bin.data_bin, save_dir, max_update=12)
    log = second[0]
    assert "Loaded checkpoint" in log and "@ 8 updates)" in log, log[-3000:]
    updates = [int(r["num_updates"]) for r in json_log_records(log, "train_inner")]
    assert updates and min(updates) > 8 and max(updates) == 12, updates
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 12
