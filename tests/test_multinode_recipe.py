"""Multi-node training through the recipe's train step (``recipes/steps/train.sh``): two recipe
processes on this machine are two CPU "nodes" of one process each (NNODES=2, NODE_RANK 0 and 1,
MASTER_ADDR/MASTER_PORT a free local port; gloo, ``--distributed-no-spawn``, legacy DDP), the
same path as fairseq's multi-node GPU launch with one process per node.

They train together: the update-freq is computed from 2 workers, and the result equals a
single-process run that accumulates the same batches (update-freq twice as large) bit for bit.
Tolerance 0, measured and expected: without dropout both runs compute the same per-batch
gradients; legacy DDP sums the two ranks' halves-of-gradients and fairseq multiplies back by the
number of workers (exact in binary floating point), where one process adds the two batches'
gradients, the same single addition. Rank 1 logs nothing after its start (fairseq raises the
log level of every rank but 0); that it ended at rank 0's update follows from the equality
(rank 1's batch is in every update) and from both processes exiting, since each update is a
collective all-reduce that neither rank can leave alone.
"""

from __future__ import annotations

import re
import socket
import subprocess

import forked_cli
import torch
from cli import json_log_records
from test_precision import RECIPE_TINY_MODEL, TRAIN_STEP, recipe_environment

MAX_UPDATE = 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def settings(work, data_bin) -> dict:
    """A tiny fp32 run on CPU, 1000 tokens per batch and per worker, ~2000 per step."""
    return dict(WORK_DIR=work, DATA_BIN=data_bin, DEVICE="cpu", PRECISION="fp32",
                MAX_UPDATE=MAX_UPDATE, SAVE_INTERVAL_UPDATES=MAX_UPDATE, AVERAGE_LAST=0,
                MAX_TOKENS=1000, TOKENS_PER_STEP=2000, WARMUP_UPDATES=10, LOG_INTERVAL=1,
                EXTRA_ARGS=f"{RECIPE_TINY_MODEL} --dropout 0")


def run_two_nodes(work, data_bin):
    port = free_port()
    procs = [subprocess.Popen(
        ["bash", str(TRAIN_STEP), "wmt14_en_de"],
        env=recipe_environment(**settings(work, data_bin), NNODES=2, NODE_RANK=rank,
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-4000:]
        outputs.append((out, err))
    return outputs


def last_model(work):
    path = work / "base" / "checkpoints" / "checkpoint_last.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["optimizer_history"][-1]["num_updates"], state["model"], state["cfg"]


UPDATE_FREQ = re.compile(r"update-freq = ceil\((\d+) / \((\d+) tokens x (\d+) cpu worker\(s\)\)\) "
                         r"= (\d+)")


def test_two_cpu_nodes_train_together_as_one_process_would(multi30k_bin, tmp_path):
    (out0, err0), (out1, err1) = run_two_nodes(tmp_path / "nodes", multi30k_bin.data_bin)
    for rank, err in enumerate((err0, err1)):
        assert f"node {rank} of 2: rank(s) {rank}..{rank} of 2, rendezvous tcp://127.0.0.1:" in err
        assert UPDATE_FREQ.findall(err) == [("2000", "1000", "2", "1")], err[-2000:]
    assert "distributed init (rank 1)" in out1
    # rank 0 logged every update; node 0 recorded the run, node 1 logged to its own file
    updates = [int(r["num_updates"]) for r in json_log_records(out0, "train_inner")]
    assert updates == list(range(1, MAX_UPDATE + 1)), out0[-3000:]
    checkpoints = tmp_path / "nodes" / "base" / "checkpoints"
    assert (checkpoints / ".done").is_file()
    assert "distributed init (rank 1)" in (tmp_path / "nodes" / "base" / "train.node1.log"
                                           ).read_text()
    nodes_update, nodes_model, nodes_cfg = last_model(tmp_path / "nodes")
    assert nodes_update == MAX_UPDATE
    assert nodes_cfg["distributed_training"]["distributed_world_size"] == 2
    assert nodes_cfg["optimization"]["update_freq"] == [1]

    single = forked_cli.run(["bash", str(TRAIN_STEP), "wmt14_en_de"],
                            env=recipe_environment(**settings(tmp_path / "one",
                                                              multi30k_bin.data_bin)),
                            capture_output=True, text=True, timeout=900)
    assert single.returncode == 0, single.stderr[-3000:]
    assert UPDATE_FREQ.findall(single.stderr) == [("2000", "1000", "1", "2")]
    one_update, one_model, _ = last_model(tmp_path / "one")
    assert one_update == MAX_UPDATE
    assert nodes_model.keys() == one_model.keys()
    for name, tensor in one_model.items():
        assert torch.equal(nodes_model[name], tensor), name
    first = json_log_records(single.stdout, "train_inner")[0]
    assert first["loss"] == json_log_records(out0, "train_inner")[0]["loss"]

    # a rerun of the finished two-node run changes nothing on either node
    reruns = run_two_nodes(tmp_path / "nodes", multi30k_bin.data_bin)
    for _, err in reruns:
        assert "already done" in err and "+ fairseq-train" not in err
