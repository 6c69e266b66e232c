"""``vaswani-plot-training`` and user_plugin/training_log.py on real fairseq-train logs: the
series read, the picture of one log and of two overlaid, and one-line errors for bad logs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import forked_cli
import pytest
from cli import PAPER_OPTIMIZATION_ARGS, USER_DIR, command, fairseq_env, run_fairseq

from user_plugin.commands import plot_training
from user_plugin.files import UserError
from user_plugin.training_log import read_training_log

REPO = Path(__file__).resolve().parents[1]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_script(*args) -> subprocess.CompletedProcess:
    return forked_cli.run([*command("plot_training"), *map(str, args)], capture_output=True,
                          text=True, env=fairseq_env(), timeout=300)


@pytest.fixture(scope="module")
def json_log(trained_multi30k, tmp_path_factory) -> Path:
    """The shared fixture's fairseq-train output (--log-format json, 60 updates, logged every
    5, validated every 20 and at the end of an epoch), saved as a log file."""
    path = tmp_path_factory.mktemp("json_run") / "checkpoints" / "train.log"
    path.parent.mkdir()
    path.write_text(trained_multi30k.train_log, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bleu_log(multi30k_bin, tmp_path_factory) -> Path:
    """A second real run, --log-format simple, with validation BLEU (beam 4, alpha 0.6 through
    the task vaswani_translation) every 8 updates, as fairseq-train writes it to a file."""
    root = tmp_path_factory.mktemp("bleu_run")
    log = root / "train.log"
    run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
        "--cpu", "--seed", "2", "--arch", "vaswani_base", "--encoder-layers", "1",
        "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-all-embeddings", *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "8",
        "--max-tokens", "800", "--max-update", "16", "--save-dir", root / "checkpoints",
        "--save-interval-updates", "8", "--no-epoch-checkpoints", "--log-format", "simple",
        "--log-interval", "4", "--log-file", log, "--required-batch-size-multiple", "1",
        "--num-workers", "0", "--max-valid-steps", "1",
        "--eval-bleu", "--eval-bleu-args", '{"beam":4,"lenpen":0.6}',
        "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
    ])
    return log


def test_series_of_a_json_log(json_log):
    log = read_training_log(json_log)
    assert log.train["loss"].updates == list(range(5, 61, 5))
    assert log.train["lr"].updates == list(range(5, 61, 5))
    assert log.valid_subset == "valid"
    # every 20 updates and at the end of the first epoch (update 36)
    assert log.valid["loss"].updates == [20, 36, 40, 60]
    assert log.valid["ppl"].updates == [20, 36, 40, 60]
    # perplexity is 2 ** nll_loss (fairseq logs both, rounded)
    for nll, ppl in zip(log.valid["nll_loss"].values, log.valid["ppl"].values):
        assert ppl == pytest.approx(2 ** nll, rel=2e-3)
    assert log.train["loss"].values[-1] < log.train["loss"].values[0]
    assert len(log.training_seconds) == 1 and log.training_seconds[0] > 0


def test_series_of_a_simple_log_with_bleu(bleu_log):
    log = read_training_log(bleu_log)
    assert log.train["loss"].updates == [4, 8, 12, 16]
    assert log.valid["bleu"].updates == [8, 16]
    assert all(0 <= value <= 100 for value in log.valid["bleu"].values)
    assert log.valid["loss"].updates == [8, 16]


def test_png_of_one_real_log(json_log, tmp_path):
    output = tmp_path / "curves.png"
    proc = run_script(json_log, "--output", output)
    assert proc.returncode == 0, proc.stderr
    assert output.read_bytes()[:8] == PNG_MAGIC
    assert not [p for p in tmp_path.iterdir() if p.name != "curves.png"]  # atomic: no leftovers


def test_two_logs_overlaid(json_log, bleu_log, tmp_path):
    output = tmp_path / "both.png"
    proc = run_script(json_log, bleu_log, "--output", output, "--labels", "json run", "bleu run")
    assert proc.returncode == 0, proc.stderr
    assert output.read_bytes()[:8] == PNG_MAGIC

    logs = [read_training_log(json_log), read_training_log(bleu_log)]
    figure = plot_training.build_figure(logs, ["json run", "bleu run"])
    try:
        titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
        assert titles == ["loss (label-smoothed, bits)", "validation perplexity",
                          "learning rate", "validation BLEU"]
        panels = {ax.get_title(): {line.get_label(): list(line.get_xdata())
                                   for line in ax.get_lines()}
                  for ax in figure.axes if ax.get_visible()}
        assert panels["loss (label-smoothed, bits)"] == {
            "json run: train": list(range(5, 61, 5)), "json run: validation": [20, 36, 40, 60],
            "bleu run: train": [4, 8, 12, 16], "bleu run: validation": [8, 16]}
        assert panels["learning rate"]["bleu run"] == [4, 8, 12, 16]
        assert panels["validation BLEU"] == {"json run": [], "bleu run": [8, 16]}
    finally:
        plot_training.pyplot().close(figure)


def test_default_labels_are_the_run_directories(json_log, bleu_log):
    logs = [read_training_log(json_log), read_training_log(bleu_log)]
    assert plot_training.labels_for(logs, None) == ["json_run0", "bleu_run0/train.log"]
    with pytest.raises(UserError, match="1 labels for 2 logs"):
        plot_training.labels_for(logs, ["one"])


def test_summary(bleu_log):
    proc = run_script(bleu_log, "--summary")
    assert proc.returncode == 0, proc.stderr
    log = read_training_log(bleu_log)
    update, best = log.valid["bleu"].best(maximize=True)
    assert f"best validation BLEU {best:.2f} at update {update}" in proc.stdout
    assert "last validation (update 16)" in proc.stdout


def test_a_resumed_run_is_drawn_as_it_went_on(tmp_path):
    """Records repeated by a run resumed from an earlier checkpoint replace the old ones."""
    line = ("2026-01-01 10:00:00 | INFO | train_inner | epoch 001:     {u} / 99 loss={loss}, "
            "nll_loss=1.0, num_updates={u}, lr=0.001, wall=1")
    valid = ("2026-01-01 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | "
             "loss {loss} | nll_loss 1 | ppl 2 | num_updates {u}")
    first = [line.format(u=u, loss=10 - u / 10) for u in (5, 10, 15, 20)]
    first.append(valid.format(u=20, loss=9.0))
    first.append("2026-01-01 10:00:00 | INFO | train_inner | epoch 001:     25 / 99 loss=")
    resumed = [line.format(u=u, loss=5.0) for u in (15, 20, 25)]
    resumed.append(valid.format(u=20, loss=4.0))
    path = tmp_path / "train.log"
    path.write_text("\n".join(first + resumed) + "\n", encoding="utf-8")
    log = read_training_log(path)
    assert log.train["loss"].updates == [5, 10, 15, 20, 25]
    assert log.train["loss"].values == [9.5, 9.0, 5.0, 5.0, 5.0]
    assert log.valid["loss"].updates == [20] and log.valid["loss"].values == [4.0]


@pytest.mark.parametrize("content, message", [
    (b"", "empty log"),
    (b"\n\n", "empty log"),
    (b"loss=3 num_updates=5\nthis is not a fairseq log\n", "no fairseq-train records"),
    (b"2026-01-01 10:00:00 | INFO | train_inner | {\"loss\": \"3.0\"}\n",
     "no fairseq-train records"),
    (b"\xff\xfe\x00binary", "not valid UTF-8 text"),
])
def test_bad_logs_are_one_error_line(tmp_path, content, message):
    path = tmp_path / "bad.log"
    path.write_bytes(content)
    output = tmp_path / "out.png"
    proc = run_script(path, "--output", output)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("vaswani-plot-training: error: ")
    assert str(path) in proc.stderr and message in proc.stderr
    assert not output.exists()


def test_missing_log_and_missing_output(tmp_path):
    proc = run_script(tmp_path / "nope.log", "--output", tmp_path / "out.png")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "nope.log: no such file" in proc.stderr
    proc = run_script(tmp_path / "nope.log")
    assert proc.returncode == 2 and "give --output PNG" in proc.stderr
