"""The recipes notice what changed under a step: a deleted marker redoes the step from scratch,
a half-finished training whose data changed starts over (saying why), a step refuses an
upstream step whose own input was redone, and no directory a live training uses is emptied.

The chain runs on a small slice of Multi30k (400 training pairs, BPE 200) with a tiny model and
6 updates. An interrupted training is made by putting a ``fairseq-train`` first on ``PATH``
that runs the real one through ``fault_injection.WRAPPER``, which SIGKILLs it after update 4.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import REPO, run_fairseq
from conftest import MULTI30K, require_data
from fault_injection import fault_env, write_wrapper
from test_recipes import TINY_MODEL_ARGS, recipe_env, run_script, run_with_common, step_script

MAX_UPDATE = 6


def num_updates(path: Path) -> int:
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return int(state["optimizer_history"][-1]["num_updates"])


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    """{train,valid,test}.{en,de}: the first 400 / 60 / 60 lines of Multi30k."""
    require_data(MULTI30K)
    raw = tmp_path_factory.mktemp("raw")
    for split, name, count in (("train", "train", 400), ("valid", "val", 60),
                               ("test", "test_2016_flickr", 60)):
        for lang in ("en", "de"):
            lines = (MULTI30K / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()
            (raw / f"{split}.{lang}").write_text("\n".join(lines[:count]) + "\n",
                                                 encoding="utf-8")
    return raw


def chain_env(raw: Path, work: Path, **overrides) -> dict:
    return recipe_env(
        RAW_DIR=raw, WORK_DIR=work, BPE_OPS=200, DEVICE="cpu", MAX_UPDATE=MAX_UPDATE,
        WARMUP_UPDATES=4, MAX_TOKENS=1024, TOKENS_PER_STEP=1024, SAVE_INTERVAL_UPDATES=3,
        AVERAGE_LAST=2, LOG_INTERVAL=1, WORKERS=1, EXTRA_ARGS=TINY_MODEL_ARGS, **overrides)


@pytest.fixture(scope="module")
def binarized(raw_dir, tmp_path_factory) -> Path:
    """A work directory after the prepare and binarize steps."""
    work = tmp_path_factory.mktemp("work") / "wmt14_en_de"
    env = chain_env(raw_dir, work)
    for step in ("prepare", "binarize"):
        run_script(step_script(step), env, "wmt14_en_de")
    return work


def killing_env(env: dict, tmp_path: Path, after_update: int) -> dict:
    """``env`` with a ``fairseq-train`` first on PATH that is SIGKILLed after an update."""
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir(exist_ok=True)
    wrapper = write_wrapper(shim_dir)
    shim = shim_dir / "fairseq-train"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{wrapper}" "$@"\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    faults = fault_env(kill_after_update=after_update)
    return {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}",
            "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),  # keep this PATH
            "FAULT_REPO": faults["FAULT_REPO"],
            "FAULT_KILL_AFTER_UPDATE": faults["FAULT_KILL_AFTER_UPDATE"]}


def test_a_deleted_marker_redoes_the_training_from_scratch(raw_dir, binarized, tmp_path):
    run_dir = tmp_path / "base"
    env = chain_env(raw_dir, binarized, RUN_DIR=run_dir)
    run_script(step_script("train"), env, "wmt14_en_de")
    checkpoints = run_dir / "checkpoints"
    assert num_updates(checkpoints / "checkpoint_last.pt") == MAX_UPDATE
    (checkpoints / ".done").unlink()
    result = run_script(step_script("train"), env, "wmt14_en_de")
    assert num_updates(checkpoints / "checkpoint_last.pt") == MAX_UPDATE  # not one more
    assert "Loaded checkpoint" not in result.stdout
    assert f"starting over in {checkpoints}: its checkpoints have no record" in result.stderr
    assert (checkpoints / ".done").is_file() and not (checkpoints / ".started").exists()


def test_the_plugins_optimizer_is_chosen_by_OPTIMIZER_and_a_changed_choice_is_a_new_run(
        raw_dir, binarized, tmp_path):
    run_dir = tmp_path / "base"
    env = chain_env(raw_dir, binarized, RUN_DIR=run_dir, OPTIMIZER="vaswani_adam")
    run_script(step_script("train"), env, "wmt14_en_de")
    last = run_dir / "checkpoints" / "checkpoint_last.pt"
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert state["last_optimizer_state"]["param_groups"][0]["betas"] == (0.9, 0.98)
    assert state["optimizer_history"][-1]["optimizer_name"] == "MultiTensorAdam"
    again = run_script(step_script("train"), env, "wmt14_en_de")
    assert "already done" in again.stderr  # a rerun of the finished run changes nothing
    # fairseq's adam is another run: the recipe starts over instead of resuming the moments
    # of another optimizer (which fairseq would refuse), once asked to (START_OVER=1: it
    # deletes the finished run's checkpoints)
    switched = run_script(step_script("train"), {**env, "OPTIMIZER": "adam", "START_OVER": "1"},
                          "wmt14_en_de")
    assert "Loaded checkpoint" not in switched.stdout
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["optimizer_name"] == "FairseqAdam"
    bad = run_script(step_script("train"), {**env, "OPTIMIZER": "sgd"}, "wmt14_en_de",
                     check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "OPTIMIZER must be adam" in bad.stderr.strip().splitlines()[-1]


def test_a_half_finished_training_notices_that_its_data_was_redone(raw_dir, binarized,
                                                                     tmp_path):
    work = tmp_path / "wmt14_en_de"
    shutil.copytree(binarized, work)
    env = chain_env(raw_dir, work)
    result = run_script(step_script("train"), killing_env(env, tmp_path, 4), "wmt14_en_de",
                        check=False)
    checkpoints = work / "base" / "checkpoints"
    assert result.returncode == 1 and "fairseq-train failed" in result.stderr
    assert (checkpoints / ".started").is_file() and not (checkpoints / ".done").exists()

    other = {**env, "BPE_OPS": "150"}
    # the data of a run that has checkpoints is redone only when asked (START_OVER=1)
    refused = run_script(step_script("prepare"), other, "wmt14_en_de", check=False)
    assert refused.returncode == 1 and "START_OVER=1" in refused.stderr
    assert num_updates(checkpoints / "checkpoint_last.pt") == 3
    other["START_OVER"] = "1"
    run_script(step_script("prepare"), other, "wmt14_en_de")
    result = run_script(step_script("train"), other, "wmt14_en_de", check=False)
    assert result.returncode == 1
    assert (f"run the binarize step again: its input {work / 'prepared'} was redone or changed "
            "since it ran") in result.stderr
    assert num_updates(checkpoints / "checkpoint_last.pt") == 3  # nothing trained on stale data

    run_script(step_script("binarize"), other, "wmt14_en_de")
    result = run_script(step_script("train"), other, "wmt14_en_de")
    assert (f"the unfinished work in {checkpoints} cannot be continued: its input "
            f"{work / 'data-bin'} was redone or changed") in result.stderr
    assert f"starting over in {checkpoints}" in result.stderr
    assert "Loaded checkpoint" not in result.stdout
    assert num_updates(checkpoints / "checkpoint_last.pt") == MAX_UPDATE


def interval_checkpoints(checkpoints: Path) -> dict:
    """``{update: bytes}`` of the interval checkpoints ``checkpoint_<epoch>_<update>.pt``."""
    return {int(path.stem.rsplit("_", 1)[1]): path.read_bytes()
            for path in checkpoints.glob("checkpoint_*_*.pt")}


def test_raising_max_update_continues_a_finished_run_and_other_changes_are_refused(
        raw_dir, binarized, tmp_path):
    """A finished run given a larger MAX_UPDATE trains on from its last checkpoint: the earlier
    checkpoints stay byte-identical, the later ones are added, the record is updated. Another
    setting, or a lowered MAX_UPDATE, is refused in one line with nothing touched."""
    run_dir = tmp_path / "base"
    env = {**chain_env(raw_dir, binarized, RUN_DIR=run_dir), "AVERAGE_LAST": "10"}  # keep all
    run_script(step_script("train"), env, "wmt14_en_de")
    checkpoints = run_dir / "checkpoints"
    finished = interval_checkpoints(checkpoints)
    assert sorted(finished) == [3, MAX_UPDATE]
    first_record = (checkpoints / ".done").read_text()

    longer = {**env, "MAX_UPDATE": str(MAX_UPDATE + 3)}
    result = run_script(step_script("train"), longer, "wmt14_en_de")
    assert (f"continuing the finished run in {checkpoints}: MAX_UPDATE grew from {MAX_UPDATE} "
            f"to {MAX_UPDATE + 3}; its checkpoints are kept") in result.stderr
    assert "starting over" not in result.stderr
    assert f"@ {MAX_UPDATE} updates)" in result.stdout  # loaded checkpoint_last.pt
    trained = [int(n) for n in re.findall(r"\bnum_updates=(\d+)", result.stdout)]
    assert trained and min(trained) == MAX_UPDATE + 1 and max(trained) == MAX_UPDATE + 3
    continued = interval_checkpoints(checkpoints)
    assert sorted(continued) == [3, MAX_UPDATE, MAX_UPDATE + 3]
    for update, data in finished.items():
        assert continued[update] == data, update  # byte-identical
    assert num_updates(checkpoints / "checkpoint_last.pt") == MAX_UPDATE + 3
    record = (checkpoints / ".done").read_text()
    assert record.split("\nid ")[1] != first_record.split("\nid ")[1]
    assert f"max_update={MAX_UPDATE + 3} " in record and not (checkpoints / ".started").exists()
    assert f"_{MAX_UPDATE + 3}.pt" in record
    assert "already done" in run_script(step_script("train"), longer, "wmt14_en_de").stderr

    untouched = {path.name: (path.stat().st_mtime_ns, path.read_bytes())
                 for path in checkpoints.iterdir() if path.is_file()}
    for change, words in (({"WARMUP_UPDATES": "5"}, "its settings changed (warmup=4 -> warmup=5)"),
                          ({"MAX_UPDATE": "4"}, f"finished at MAX_UPDATE={MAX_UPDATE + 3}, "
                                                "past the MAX_UPDATE=4 asked for now")):
        refused = run_script(step_script("train"), {**longer, **change}, "wmt14_en_de",
                             check=False)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        errors = [line for line in refused.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and errors[0].startswith("train: error: "), refused.stderr
        assert words in errors[0] and "set START_OVER=1" in errors[0]
        assert "+ fairseq-train" not in refused.stderr
        assert {path.name: (path.stat().st_mtime_ns, path.read_bytes())
                for path in checkpoints.iterdir() if path.is_file()} == untouched


def preprocess(prepared: Path, destination: Path, threshold: int) -> None:
    if destination.exists():
        shutil.rmtree(destination)
    run_fairseq("preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
        "--trainpref", prepared / "train", "--validpref", prepared / "valid",
        "--destdir", destination, "--thresholdsrc", str(threshold),
        "--thresholdtgt", str(threshold), "--workers", "1"])


def test_data_binarized_outside_the_recipe_is_identified_by_its_content(raw_dir, binarized,
                                                                        tmp_path):
    data_bin = tmp_path / "my-data-bin"
    preprocess(binarized / "prepared", data_bin, 0)
    run_dir = tmp_path / "base"
    env = chain_env(raw_dir, binarized, RUN_DIR=run_dir, DATA_BIN=data_bin)
    result = run_script(step_script("train"), killing_env(env, tmp_path, 4), "wmt14_en_de",
                        check=False)
    checkpoints = run_dir / "checkpoints"
    assert result.returncode == 1 and (checkpoints / ".started").is_file()

    preprocess(binarized / "prepared", data_bin, 3)  # re-made in place: another vocabulary
    result = run_script(step_script("train"), env, "wmt14_en_de")
    assert num_updates(checkpoints / "checkpoint_last.pt") == MAX_UPDATE
    assert "Loaded checkpoint" not in result.stdout
    assert (f"the unfinished work in {checkpoints} cannot be continued: its input {data_bin} "
            "was redone or changed") in result.stderr
    assert "upstream " + str(data_bin) + " content-" in (checkpoints / ".done").read_text()
    again = run_script(step_script("train"), env, "wmt14_en_de")
    assert "already done" in again.stderr  # the same content: finished


IN_USE_SCRIPT = r"""
set -euo pipefail
source "$COMMON"
dir=$ROOT/checkpoints
mkdir -p "$dir"
echo kept > "$dir/checkpoint_last.pt"
echo "pid 4242 on somewhere, started earlier, fairseq-train" > "$dir/.vaswani-train.lock"
flock -o "$dir/.vaswani-train.lock" sleep 30 &
holder=$!
while flock -n "$dir/.vaswani-train.lock" true; do sleep 0.1; done
status=0
( step_restart "$dir" ) || status=$?
echo "live holder: status $status, $(ls "$dir")"
kill "$holder"
wait "$holder" 2>/dev/null || true
step_restart "$dir"
echo "stale lock: $(ls -A "$dir" | wc -l) files"
"""


def test_a_directory_that_a_live_training_uses_is_never_emptied(tmp_path):
    if shutil.which("flock") is None:
        pytest.skip("the flock command (util-linux) is not installed")
    result = run_with_common(IN_USE_SCRIPT, ROOT=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["live holder: status 1, checkpoint_last.pt",
                                          "stale lock: 0 files"]
    assert (f"{tmp_path / 'checkpoints'} is in use by a training run that is still going on "
            "(pid 4242 on somewhere, started earlier, fairseq-train)") in result.stderr


def test_the_recipes_gpu_defaults_come_from_training_defaults():
    """recipes/common.sh reads the precision and optimizer, and why, from the one place that the
    GPU kit's figures and the CPU measurements change (user_plugin/training_defaults.py)."""

    from user_plugin.measurement.cpu import cpu_flags
    from user_plugin.training_defaults import CPU_OPTIMIZER, CUDA_TRAINING_DEFAULTS, cpu_precision

    def defaults(*args: str) -> list:
        return forked_cli.run([sys.executable, "-m", "user_plugin.training_defaults", *args],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout.split()

    for capability, precision in (("7", "fp16"), ("9", CUDA_TRAINING_DEFAULTS["precision"])):
        assert defaults("gpu", capability)[:2] == [precision, CUDA_TRAINING_DEFAULTS["optimizer"]]
    assert defaults("cpu")[:2] == [cpu_precision(cpu_flags())[0], CPU_OPTIMIZER]
    common = (REPO / "recipes" / "common.sh").read_text(encoding="utf-8")
    assert 'python -m user_plugin.training_defaults "$DEVICE" "$capability"' in common
    assert "OPTIMIZER=${OPTIMIZER:-$DEVICE_OPTIMIZER}" in (
        REPO / "recipes" / "steps" / "train.sh").read_text(encoding="utf-8")

