"""The progress line with the time left (user_plugin/progress.py), and TensorBoard logging, in
a real fairseq-train under fairseq's own --task translation."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
from cli import PAPER_OPTIMIZATION_ARGS, USER_DIR, run_fairseq

from user_plugin.fairseq_patches.progress import (
    ProgressClock,
    ProgressEstimate,
    format_duration,
    progress_record,
    progress_text,
)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_time_left_is_the_mean_time_per_update_times_the_updates_left():
    clock = FakeClock()
    progress = ProgressClock(max_update=1000, clock=clock)
    clock.now += 50.0
    estimate = progress.estimate(100)
    assert estimate.elapsed == 50.0
    assert estimate.seconds_per_update == 0.5
    assert estimate.remaining == 450.0
    assert estimate.percent == 10.0
    clock.now += 150.0  # a slower stretch (a validation) raises the mean
    estimate = progress.estimate(200)
    assert estimate.seconds_per_update == 1.0
    assert estimate.remaining == 800.0
    clock.now += 10.0
    assert progress.estimate(1000).remaining == 0.0
    assert progress.estimate(1100).remaining == 0.0  # never negative past the bound


def test_a_resumed_run_counts_only_its_own_updates():
    clock = FakeClock()
    progress = ProgressClock(max_update=2000, start_update=1500, clock=clock)
    clock.now += 30.0
    estimate = progress.estimate(1560)
    assert estimate.seconds_per_update == 0.5  # 30 s / 60 updates, not / 1560
    assert estimate.remaining == 220.0
    assert estimate.start_update == 1500


def test_without_a_bound_there_is_no_time_left():
    clock = FakeClock()
    progress = ProgressClock(max_update=0, clock=clock)
    clock.now += 8.0
    estimate = progress.estimate(16)
    assert estimate.max_update is None and estimate.remaining is None
    assert estimate.seconds_per_update == 0.5
    assert progress_text(estimate) == "update 16 | elapsed 0:00:08 | 0.50 s/update"


def test_durations_and_the_line():
    assert format_duration(0) == "0:00:00"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(3 * 3600 + 25 * 60 + 7) == "3:25:07"
    assert format_duration(float("nan")) == "?"
    estimate = ProgressEstimate(num_updates=150, max_update=1800, start_update=0,
                                elapsed=125.0, seconds_per_update=125.0 / 150,
                                remaining=1650 * 125.0 / 150)
    assert progress_text(estimate, loss=7.41234, lr=0.000154) == (
        "update 150/1800 (8.3%) | elapsed 0:02:05 | left 0:22:55 (0.83 s/update) "
        "| loss 7.412 | lr 0.000154")
    record = progress_record(estimate, loss=7.5, lr=1e-4)
    assert record["remaining"] == pytest.approx(1375.0)
    assert record["percent"] == pytest.approx(100 * 150 / 1800)
    assert json.loads(json.dumps(record)) == record


TINY = [
    "--arch", "vaswani_base", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings",
]


def train(data_bin: Path, save_dir: Path, max_update: int, log_format: str,
          tensorboard: Path) -> str:
    """A tiny fairseq-train (fairseq's own --task translation) to ``max_update``, logging every
    4 updates; its output."""
    proc = run_fairseq("train", [
        data_bin, "--user-dir", USER_DIR, "--task", "translation", "--cpu", "--seed", "1",
        *TINY, *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "10",
        "--max-tokens", "800", "--max-update", str(max_update),
        "--save-dir", save_dir, "--save-interval-updates", "6", "--no-epoch-checkpoints",
        "--log-format", log_format, "--log-interval", "4", "--tensorboard-logdir", tensorboard,
        "--required-batch-size-multiple", "1", "--num-workers", "0",
        "--max-valid-steps", "2",
    ])
    return proc.stdout + proc.stderr


def progress_lines(output: str) -> list[str]:
    return [line.split(" | progress | ", 1)[1] for line in output.splitlines()
            if " | progress | " in line]


def train_inner_updates(output: str) -> list[int]:
    updates = []
    for line in output.splitlines():
        if " | train_inner | " in line:
            record = json.loads(line[line.index("{"):]) if "{" in line else None
            if record is not None:
                updates.append(int(record["num_updates"]))
            else:
                updates.append(int(re.search(r"num_updates=(\d+)", line).group(1)))
    return updates


def tensorboard_scalars(directory: Path) -> dict[str, list[int]]:
    """tag -> steps of the scalars in the TensorBoard event files of ``directory`` (the
    TFRecord framing read by hand, the events parsed with tensorboardX's protobuf classes)."""
    from tensorboardX.proto import event_pb2

    steps: dict[str, list[int]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            payload = data[offset + 12: offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


def test_progress_lines_and_tensorboard_in_a_real_run(multi30k_bin, tmp_path):
    save_dir, tensorboard = tmp_path / "checkpoints", tmp_path / "tensorboard"
    output = train(multi30k_bin.data_bin, save_dir, 12, "json", tensorboard)

    # a progress record after every train_inner record, with the run's arithmetic
    assert train_inner_updates(output) == [4, 8, 12]
    lines = progress_lines(output)
    assert lines[0] == ("training from update 0 to update 12; progress every 4 updates, "
                        "time counted from now")
    records = [json.loads(line) for line in lines[1:]]
    assert [r["num_updates"] for r in records] == [4, 8, 12]
    for record in records:
        assert record["max_update"] == 12 and record["start_update"] == 0
        assert record["percent"] == pytest.approx(100 * record["num_updates"] / 12)
        assert record["seconds_per_update"] == pytest.approx(
            record["elapsed"] / record["num_updates"])
        assert record["remaining"] == pytest.approx(
            (12 - record["num_updates"]) * record["seconds_per_update"])
        assert record["loss"] > 0 and record["lr"] > 0
    assert records[-1]["remaining"] == 0
    elapsed = [r["elapsed"] for r in records]
    assert elapsed == sorted(elapsed)

    # TensorBoard: training and validation scalars at the updates they were logged at
    inner = tensorboard_scalars(tensorboard / "train_inner")
    assert inner["loss"] == [4, 8, 12] and inner["lr"] == [4, 8, 12]
    valid = tensorboard_scalars(tensorboard / "valid")
    assert valid["loss"] == [6, 12] and valid["ppl"] == [6, 12]

    # resumed with a higher bound, in the simple format: time counts from the resumed update
    output = train(multi30k_bin.data_bin, save_dir, 20, "simple", tensorboard)
    lines = progress_lines(output)
    assert lines[0].startswith("training from update 12 to update 20;")
    assert train_inner_updates(output) == [16, 20]
    pattern = re.compile(
        r"update (\d+)/20 \((\d+\.\d)%\) \| elapsed (\d+):(\d\d):(\d\d) \| left (\d+):(\d\d):"
        r"(\d\d) \((\d+\.\d\d) s/update\) \| loss \d+\.\d{3} \| lr \S+")
    matches = [pattern.fullmatch(line) for line in lines[1:]]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [16, 20]
    assert [m.group(2) for m in matches] == ["80.0", "100.0"]
    first = matches[0]
    left = int(first.group(6)) * 3600 + int(first.group(7)) * 60 + int(first.group(8))
    # 4 updates left at the shown rate, to the shown (rounded) precision
    assert abs(left - 4 * float(first.group(9))) <= 0.5 + 4 * 0.005
    assert inner_steps_after_resume(tensorboard) == [4, 8, 12, 16, 20]


def inner_steps_after_resume(tensorboard: Path) -> list[int]:
    return sorted(set(tensorboard_scalars(tensorboard / "train_inner")["loss"]))
