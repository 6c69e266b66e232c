"""Faults and bad input: nothing is lost and every error is clear.

The matrix of what was tried, what happens and which test shows it is docs/faults.md.

Killed training runs use a wrapper script written by the tests (``fault_injection.WRAPPER``):
it runs the real ``fairseq-train`` after installing, from environment variables, a hook that
SIGKILLs the process at a chosen point (after an update, inside ``torch.save`` of a checkpoint,
inside the copy to ``checkpoint_last.pt``, after a save), pauses it, or makes the disk full.
The product code has no test hooks.
"""

import importlib
import io
import logging
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import forked_cli
import pytest
import torch
from cli import (
    PAPER_OPTIMIZATION_ARGS,
    REPO,
    TINY_MODEL_ARGS,
    USER_DIR,
    command,
    fairseq_env,
    run_fairseq,
)
from conftest import TINY, build_vaswani, make_dictionary
from fault_injection import (
    FullDisk,
    fault_env,
    flip_a_byte,
    run_wrapped_args,
    snapshot,
    wrapped_command,
)

from user_plugin import hub
from user_plugin.commands import average_checkpoints, prepare_text, translate
from user_plugin.files import TEMP_SUFFIX, run_main

NOISE = ("Warning", "warnings.warn", "tensorboardX", "autocast",  # library chatter on stderr
         "assuming the recipes' text pipeline")  # the hub on a directory without a record


MAX_UPDATE = 30
SAVE_EVERY = 10


def train_args(data_bin: Path, save_dir: Path) -> list:
    return [
        data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "3",
        *TINY_MODEL_ARGS, *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "20",
        "--max-tokens", "1500", "--max-update", str(MAX_UPDATE),
        "--save-interval-updates", str(SAVE_EVERY), "--disable-validation",
        "--save-dir", save_dir, "--log-format", "simple", "--log-interval", "10",
        "--required-batch-size-multiple", "1", "--num-workers", "0",
    ]


def run_wrapped(tmp_path: Path, data_bin: Path, save_dir: Path, **faults: str):
    """Run fairseq-train through :data:`fault_injection.WRAPPER` with ``FAULT_<NAME>``
    variables set."""
    return run_wrapped_args(tmp_path, train_args(data_bin, save_dir), **faults)


def load_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def num_updates(path: Path) -> int:
    return int(load_state(path)["optimizer_history"][-1]["num_updates"])


@pytest.fixture(scope="module")
def reference_run(multi30k_bin, tmp_path_factory) -> SimpleNamespace:
    """An uninterrupted run of MAX_UPDATE updates: the reference for resumes, and a trained
    checkpoint for the generation tests."""
    root = tmp_path_factory.mktemp("uninterrupted")
    proc = run_wrapped(root, multi30k_bin.data_bin, root / "checkpoints")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = root / "checkpoints" / "checkpoint_last.pt"
    assert num_updates(last) == MAX_UPDATE
    return SimpleNamespace(checkpoint=last, data_bin=multi30k_bin.data_bin,
                           text_dir=multi30k_bin.text_dir, model=load_state(last)["model"])


@pytest.fixture(scope="module")
def uninterrupted(reference_run) -> dict:
    return reference_run.model


def assert_resumes_to_the_same_model(tmp_path, multi30k_bin, save_dir, uninterrupted, resumed_at):
    """``checkpoint_last.pt`` loads and holds update ``resumed_at``; a plain rerun resumes there
    and ends with the uninterrupted run's update count and parameters."""
    last = save_dir / "checkpoint_last.pt"
    assert num_updates(last) == resumed_at
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Loaded checkpoint {last} (epoch 1 @ {resumed_at} updates)" in proc.stdout
    assert num_updates(last) == MAX_UPDATE
    model = load_state(last)["model"]
    assert model.keys() == uninterrupted.keys()
    for key, value in uninterrupted.items():
        torch.testing.assert_close(model[key], value, rtol=0, atol=1e-6, msg=key)


def test_sigkill_mid_run_resumes_from_the_last_checkpoint(tmp_path, multi30k_bin, uninterrupted):
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_after_update=25)
    assert proc.returncode == -signal.SIGKILL
    assert_resumes_to_the_same_model(tmp_path, multi30k_bin, save_dir, uninterrupted, 20)


def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, multi30k_bin,
                                                                   uninterrupted):
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_in_save=2)
    assert proc.returncode == -signal.SIGKILL
    # the checkpoint is written to a temporary file and renamed: only that file is partial
    assert not list(save_dir.glob("checkpoint_*_20.pt"))
    assert_resumes_to_the_same_model(tmp_path, multi30k_bin, save_dir, uninterrupted, 10)


def test_sigkill_while_copying_to_checkpoint_last_keeps_the_previous_one(tmp_path, multi30k_bin,
                                                                         uninterrupted):
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_in_copy_to_last=2)
    assert proc.returncode == -signal.SIGKILL
    assert num_updates(save_dir / "checkpoint_1_20.pt") == 20  # the complete source of the copy
    assert_resumes_to_the_same_model(tmp_path, multi30k_bin, save_dir, uninterrupted, 10)


def test_without_the_plugin_fix_the_same_kill_truncates_checkpoint_last(tmp_path, multi30k_bin):
    """The control for the test above: fairseq's own copy writes straight onto the file."""
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_in_copy_to_last=2,
                       fairseq_copy=1)
    assert proc.returncode == -signal.SIGKILL
    last = save_dir / "checkpoint_last.pt"
    assert 0 < last.stat().st_size < (save_dir / "checkpoint_1_20.pt").stat().st_size
    with pytest.raises(RuntimeError):
        load_state(last)


# --------------------------------------------------------------------------------------------
# Bad checkpoint files given to averaging, the hub and plot_attention


def bad_checkpoint(kind: str, directory: Path, good: Path) -> Path:
    """A file that is not a usable checkpoint, and what the error must say about it."""
    path = directory / f"{kind}.pt"
    if kind == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("this is not a checkpoint\n", encoding="utf-8")
    elif kind == "foreign_torch_file":
        torch.save({"weights": torch.zeros(3)}, path)
    return path


BAD_KINDS = {  # kind -> words the one-line error must contain besides the file name
    "truncated": "truncated",
    "empty": "empty file",
    "text": "not a PyTorch file",
    "foreign_torch_file": "not a fairseq checkpoint",
}


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if not any(n in line for n in NOISE)]
    assert "Traceback" not in stderr
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_averaging_refuses_a_bad_checkpoint_in_one_line(kind, reference_run, tmp_path, capsys):
    bad = bad_checkpoint(kind, tmp_path, reference_run.checkpoint)
    output = tmp_path / "averaged.pt"
    status = run_main(average_checkpoints.main,
                      ["--inputs", str(reference_run.checkpoint), str(bad), "--output",
                       str(output)], average_checkpoints.PROG)
    line = one_error_line(capsys.readouterr().err)
    assert status == 1 and str(bad) in line and BAD_KINDS[kind] in line
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_hub_refuses_a_bad_checkpoint_in_one_line(kind, reference_run, tmp_path, capsys,
                                                  monkeypatch):
    bad = bad_checkpoint(kind, tmp_path, reference_run.checkpoint)
    with pytest.raises(hub.ArtifactError) as info:
        hub.load_translator(reference_run.data_bin, checkpoints=[bad], source_lang="en",
                            target_lang="de")
    message = str(info.value)
    assert str(bad) in message and BAD_KINDS[kind] in message and "\n" not in message
    monkeypatch.setattr("sys.stdin", io.StringIO("a man .\n"))
    status = run_main(translate.main, [str(reference_run.data_bin), "--checkpoints", str(bad),
                                       "--source-lang", "en", "--target-lang", "de"],
                      translate.PROG)
    captured = capsys.readouterr()
    assert status == 1 and captured.out == ""
    assert one_error_line(captured.err) == f"vaswani-translate: error: {message}"


@pytest.mark.parametrize("tool", ["hub", "plot_attention"])
def test_truncated_checkpoint_through_the_real_commands(tool, reference_run, tmp_path):
    """As a user runs them: exit status, one line on stderr, no traceback, nothing written."""
    bad = bad_checkpoint("truncated", tmp_path, reference_run.checkpoint)
    out_dir = tmp_path / "attention"
    if tool == "hub":
        cmd = [sys.executable, "-m", "user_plugin.hub", str(reference_run.data_bin),
               "--checkpoints", str(bad), "--source-lang", "en", "--target-lang", "de"]
    else:
        cmd = [*command("plot_attention"), "--checkpoint",
               str(bad), "--data-dir", str(reference_run.data_bin), "--source-lang", "en",
               "--target-lang", "de", "--source", "a man .", "--out-dir", str(out_dir)]
    proc = forked_cli.run(cmd, input="a man .\n", cwd=REPO, env=fairseq_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and proc.stdout == ""
    line = one_error_line(proc.stderr)
    assert str(bad) in line and "truncated" in line
    assert not out_dir.exists()


def generate_error_line(stderr: str) -> str:
    """fairseq-generate's error line: it logs on stderr, so the error is the last line; no
    traceback."""
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("generate.py: error: "), stderr[-3000:]
    return line


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_fairseq_generate_refuses_a_bad_checkpoint_in_one_line(kind, reference_run, tmp_path):
    """fairseq's own loader, through the plugin: the file named, no traceback."""
    bad = bad_checkpoint(kind, tmp_path, reference_run.checkpoint)
    proc = forked_cli.run(
        [sys.executable, "-m", "fairseq_cli.generate", str(reference_run.data_bin), "--user-dir",
         USER_DIR, "--path", str(bad), "--cpu", "--gen-subset", "test", "--beam", "1"],
        env=fairseq_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "H-" not in proc.stdout
    line = generate_error_line(proc.stderr)
    assert line.startswith(f"generate.py: error: {bad}: ") and BAD_KINDS[kind] in line


# --------------------------------------------------------------------------------------------
# Averaging checkpoints of different architectures or vocabularies


def synthetic_checkpoint(path: Path, vocabulary: int = 20, **overrides) -> Path:
    torch.manual_seed(0)
    model = build_vaswani(make_dictionary(vocabulary), **{**TINY, **overrides})
    torch.save({"model": model.state_dict(), "cfg": None}, path)
    return path


@pytest.mark.parametrize("change, words", [
    (dict(vocabulary=24), "another architecture or vocabulary"),
    (dict(encoder_ffn_embed_dim=48), "another architecture or vocabulary"),
    (dict(encoder_layers=3), "another architecture"),
])
def test_averaging_refuses_other_architectures_and_vocabularies(change, words, tmp_path, capsys):
    first = synthetic_checkpoint(tmp_path / "a.pt")
    other = synthetic_checkpoint(tmp_path / "b.pt", **change)
    output = tmp_path / "avg.pt"
    status = run_main(average_checkpoints.main, ["--inputs", str(first), str(other),
                                                 "--output", str(output)],
                      average_checkpoints.PROG)
    line = one_error_line(capsys.readouterr().err)
    assert status == 1 and str(other) in line and words in line
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]


# --------------------------------------------------------------------------------------------
# Corpora: sides of different lengths, empty files, a missing side (vaswani-prepare-text)


def prepare(argv: list, capsys) -> tuple:
    status = run_main(prepare_text.main, [str(a) for a in argv], prepare_text.PROG)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_check_lines_names_both_files_and_counts_when_sides_differ(tmp_path, capsys):
    (tmp_path / "train.en").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("x\ny\n", encoding="utf-8")
    status, out, err = prepare(["check-lines", tmp_path / "train.en", tmp_path / "train.de"],
                               capsys)
    line = one_error_line(err)
    assert status == 1 and out == ""
    assert f"{tmp_path / 'train.en'}: 3" in line and f"{tmp_path / 'train.de'}: 2" in line


def test_check_lines_refuses_empty_files(tmp_path, capsys):
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("", encoding="utf-8")
    status, _, err = prepare(["check-lines", tmp_path / "train.en", tmp_path / "train.de"],
                             capsys)
    line = one_error_line(err)
    assert status == 1 and "no lines" in line and str(tmp_path / "train.de") in line


def test_check_lines_names_a_missing_side(tmp_path, capsys):
    (tmp_path / "train.en").write_text("a\n", encoding="utf-8")
    status, _, err = prepare(["check-lines", tmp_path / "train.en", tmp_path / "train.de"],
                             capsys)
    line = one_error_line(err)
    assert status == 1 and line.endswith(f"{tmp_path / 'train.de'}: no such file")


def test_clean_refuses_unaligned_sides_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "raw.en").write_text("a b\nc d\ne f\n", encoding="utf-8")
    (tmp_path / "raw.de").write_text("x y\nz w\n", encoding="utf-8")
    status, _, err = prepare(["clean", "--src-in", tmp_path / "raw.en", "--tgt-in",
                              tmp_path / "raw.de", "--src-out", tmp_path / "clean.en",
                              "--tgt-out", tmp_path / "clean.de"], capsys)
    line = one_error_line(err)
    assert status == 1 and "not aligned" in line and f"{tmp_path / 'raw.de'} ends after 2" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.de", "raw.en"]


# --------------------------------------------------------------------------------------------
# Invalid architecture options


def test_heads_not_dividing_d_model_is_refused_by_fairseq_train(multi30k_bin, tmp_path):
    args = [multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", *TINY_MODEL_ARGS,
            *PAPER_OPTIMIZATION_ARGS, "--encoder-attention-heads", "3", "--max-update", "1",
            "--max-tokens", "500", "--save-dir", tmp_path / "checkpoints"]
    with pytest.raises(AssertionError) as info:
        run_fairseq("train", args)
    last = str(info.value).strip().splitlines()[-1]
    assert "--encoder-embed-dim 64 is not divisible by --encoder-attention-heads 3" in last
    assert not list(tmp_path.glob("**/*.pt"))  # fairseq made the save dir, nothing in it


@pytest.mark.parametrize("overrides, option", [
    (dict(encoder_attention_heads=3), "--encoder-attention-heads 3"),
    (dict(decoder_attention_heads=5), "--decoder-attention-heads 5"),
    (dict(dropout=-0.1), "--dropout must be in [0, 1), got -0.1"),
    (dict(attention_dropout=1.0), "--attention-dropout must be in [0, 1), got 1.0"),
    (dict(encoder_layers=0), "--encoder-layers must be at least 1, got 0"),
    (dict(decoder_layers=0), "--decoder-layers must be at least 1, got 0"),
    (dict(encoder_ffn_embed_dim=0), "--encoder-ffn-embed-dim must be positive, got 0"),
    (dict(attention_key_dim=0, attention_value_dim=8), "--attention-key-dim must be positive"),
    (dict(max_source_positions=0), "--max-source-positions must be positive, got 0"),
])
def test_invalid_options_are_refused_when_the_model_is_built(overrides, option):
    with pytest.raises(ValueError) as info:
        build_vaswani(make_dictionary(20), **{**TINY, **overrides})
    assert option in str(info.value)


def test_key_and_value_dims_allow_heads_that_do_not_divide_d_model():
    model = build_vaswani(make_dictionary(20), **{**TINY, "encoder_attention_heads": 3,
                                                   "decoder_attention_heads": 3,
                                                   "attention_key_dim": 8,
                                                   "attention_value_dim": 8})
    assert model.encoder is not None


# --------------------------------------------------------------------------------------------
# Sentences longer than the model's positions; empty lines at generation

SHORT_POSITIONS = ["--max-source-positions", "16", "--max-target-positions", "16"]


def test_long_pairs_are_skipped_with_a_count_in_training_and_validation(multi30k_bin, tmp_path):
    """fairseq alone stops at the first validation; the task skips and counts them instead."""
    save_dir = tmp_path / "checkpoints"
    proc = run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation", "--cpu",
        *TINY_MODEL_ARGS, *PAPER_OPTIMIZATION_ARGS, *SHORT_POSITIONS, "--warmup-updates", "4",
        "--max-tokens", "1000", "--max-update", "4", "--save-interval-updates", "2",
        "--save-dir", save_dir, "--required-batch-size-multiple", "1", "--num-workers", "0",
    ])
    log = proc.stdout + proc.stderr
    assert "samples have invalid sizes and will be skipped, max_positions=(16, 16)" in log
    assert "valid: skipped " in log and "longer than max_positions=(16, 16)" in log
    assert log.count("valid on 'valid' subset") >= 2  # at update 2 (mid-epoch) and at the end
    assert num_updates(save_dir / "checkpoint_1_2.pt") == 2
    assert num_updates(save_dir / "checkpoint_last.pt") == 4


def test_generate_refuses_long_test_sentences_before_decoding_or_skips_them_with_a_count(
        reference_run):
    common = [reference_run.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
              "--path", reference_run.checkpoint, "--cpu", "--gen-subset", "test",
              "--required-batch-size-multiple", "1", "--beam", "1", *SHORT_POSITIONS]
    with pytest.raises(AssertionError) as info:
        run_fairseq("generate", common)
    assert "--skip-invalid-size-inputs-valid-test" in str(info.value)
    assert "\nH-" not in str(info.value)
    proc = run_fairseq("generate", [*common, "--skip-invalid-size-inputs-valid-test"])
    skipped = int(re.search(r"(\d+) samples have invalid sizes", proc.stderr).group(1))
    decoded = sum(line.startswith("H-") for line in proc.stdout.splitlines())
    assert skipped > 0 and decoded + skipped == 100


def test_hub_refuses_a_sentence_longer_than_the_model_before_decoding(reference_run):
    translator = hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                                     source_lang="en", target_lang="de", moses=False)
    limit = hub._max_source_tokens(translator.max_positions)
    with pytest.raises(ValueError, match=rf"sentence 2 has {limit + 1} tokens .* {limit} source"):
        translator.translate(["a dog .", " ".join(["dog"] * limit)])


def test_hub_keeps_empty_lines_as_empty_translations(reference_run):
    translator = hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                                     source_lang="en", target_lang="de", beam=2)
    lines = ["A dog runs.", "", "   ", "A man."]
    outputs = translator.translate(lines)
    assert len(outputs) == 4 and outputs[1] == outputs[2] == ""
    assert outputs[0] and outputs[3]
    assert translator.translate(lines, nbest=2)[1] == ["", ""]


def test_interactive_keeps_one_output_per_input_line_with_empty_lines(reference_run):
    lines = ["a man is walking .", "", "", "a dog ."]
    cmd = [sys.executable, "-m", "fairseq_cli.interactive", str(reference_run.data_bin),
           "--user-dir", USER_DIR, "--task", "vaswani_translation", "--path",
           str(reference_run.checkpoint), "--cpu", "--beam", "2", "--source-lang", "en",
           "--target-lang", "de", "--buffer-size", "2", "--batch-size", "2"]
    proc = forked_cli.run(cmd, input="\n".join(lines) + "\n", env=fairseq_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sources = [line.split("\t")[1] if "\t" in line else ""
               for line in proc.stdout.splitlines() if line.startswith("S-")]
    ids = [int(line.split("\t")[0][2:]) for line in proc.stdout.splitlines()
           if line.startswith("H-")]
    assert ids == [0, 1, 2, 3]
    assert sources == lines


# --------------------------------------------------------------------------------------------
# The save directory: final means final, one writer, intact resumes, no orphans, full disks

LOCK = ".vaswani-train.lock"


def train_error_line(stderr: str) -> str:
    """fairseq-train's error line: the last line of its stderr (where hydra prints its
    deprecation warnings first), no traceback."""
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("fairseq-train: error: "), stderr[-3000:]
    return line


def without_lock(files: dict) -> dict:
    return {name: value for name, value in files.items() if name != LOCK}


def test_rerun_of_a_finished_run_stops_at_once_and_changes_nothing(reference_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    shutil.copytree(reference_run.checkpoint.parent, save_dir)
    before = snapshot(save_dir)
    proc = run_wrapped(tmp_path, reference_run.data_bin, save_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"training already finished: {save_dir / 'checkpoint_last.pt'} holds update "
            f"{MAX_UPDATE} and --max-update is {MAX_UPDATE}; nothing was loaded or written"
            in proc.stdout)
    assert "Loaded checkpoint" not in proc.stdout and "Saved checkpoint" not in proc.stdout
    assert snapshot(save_dir) == before  # every file byte-identical, nothing added


def test_sigkill_after_the_final_save_then_rerun_changes_nothing(multi30k_bin, tmp_path):
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_after_save=MAX_UPDATE)
    assert proc.returncode == -signal.SIGKILL
    assert num_updates(save_dir / "checkpoint_last.pt") == MAX_UPDATE
    assert (save_dir / LOCK).exists()  # the killed run never released its lock
    before = snapshot(save_dir)
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training already finished" in proc.stdout and "took over the lock" in proc.stdout
    # the checkpoints are untouched; the stale lock is released like any other
    assert snapshot(save_dir) == without_lock(before) and not (save_dir / LOCK).exists()


@pytest.mark.parametrize("reset, finished", [
    ([], True), (["--reset-lr-scheduler", "--reset-meters"], True),
    (["--reset-optimizer"], False), (["--reset-dataloader"], True),
])
def test_reset_options_decide_whether_a_finished_run_goes_on(reset, finished):
    """--reset-optimizer restarts the update count (a new phase of training runs);
    --reset-dataloader restarts the epochs, which only matters for --max-epoch."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from user_plugin.fairseq_patches.save_directory import finished_reason

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "data", "--arch", "vaswani_base", "--max-update", "30", "--max-epoch", "2", *reset])
    cfg = convert_namespace_to_omegaconf(args)
    state = {"optimizer_history": [{"num_updates": 30}],
             "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 30}}}
    reason = finished_reason(state, Path("ckpt.pt"), cfg.checkpoint, cfg.optimization)
    assert (reason is not None) == finished
    by_epochs = {"optimizer_history": [{"num_updates": 12}],
                 "extra_state": {"train_iterator": {"epoch": 3, "iterations_in_epoch": 0}}}
    reason = finished_reason(by_epochs, Path("ckpt.pt"), cfg.checkpoint, cfg.optimization)
    assert (reason is not None) == ("--reset-dataloader" not in reset)
    if reason is not None:
        assert reason == "ckpt.pt holds the end of epoch 2 and --max-epoch is 2"


def test_a_second_training_on_the_same_save_dir_is_refused_and_touches_nothing(
        multi30k_bin, tmp_path, uninterrupted):
    """Two real processes: the first holds the directory (paused after update 15); the second
    stops at start with one line naming it, and changes nothing; the first then finishes with
    the parameters of an undisturbed run."""
    save_dir = tmp_path / "checkpoints"
    pause = tmp_path / "pause"
    pause.touch()
    first = subprocess.Popen(
        wrapped_command(tmp_path, train_args(multi30k_bin.data_bin, save_dir)),
        env=fault_env(pause_after_update=15, pause_file=pause), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not pause.with_suffix(".paused").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        before = snapshot(save_dir)
        second_dir = tmp_path / "second"
        second_dir.mkdir()
        second = run_wrapped(second_dir, multi30k_bin.data_bin, save_dir)
        assert second.returncode == 1
        line = train_error_line(second.stderr)
        assert line.startswith(f"fairseq-train: error: {save_dir} is in use by another "
                               f"training run (pid {first.pid} on ")
        assert snapshot(save_dir) == before
    finally:
        pause.unlink()
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    model = load_state(save_dir / "checkpoint_last.pt")["model"]
    for key, value in uninterrupted.items():
        torch.testing.assert_close(model[key], value, rtol=0, atol=1e-6, msg=key)
    assert not (save_dir / LOCK).exists()


def test_a_killed_runs_lock_and_partial_files_are_cleaned_up_by_the_next_run(
        multi30k_bin, tmp_path, uninterrupted):
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_in_save=2)
    assert proc.returncode == -signal.SIGKILL
    orphans = [p for p in save_dir.iterdir() if p.name.endswith((TEMP_SUFFIX, ".pt.tmp"))]
    assert len(orphans) == 1 and orphans[0].stat().st_size > 0
    killed = re.match(r"pid (\d+) on ", (save_dir / LOCK).read_text()).group(1)
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"took over the lock of {save_dir}" in proc.stdout and f"(pid {killed} on" in proc.stdout
    assert f"removed {orphans[0].name} (" in proc.stdout
    assert num_updates(save_dir / "checkpoint_last.pt") == MAX_UPDATE
    leftovers = [p.name for p in save_dir.iterdir()
                 if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == []


def test_damaged_checkpoints_make_the_resume_use_the_newest_intact_one(multi30k_bin, tmp_path,
                                                                       uninterrupted):
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, kill_after_update=25)
    assert proc.returncode == -signal.SIGKILL
    for name in ("checkpoint_last.pt", "checkpoint_1_20.pt"):  # both hold update 20
        flip_a_byte(save_dir / name)
    assert_resumes_to_the_same_model_from(tmp_path, multi30k_bin, save_dir, uninterrupted,
                                          save_dir / "checkpoint_1_10.pt", 10)


def assert_resumes_to_the_same_model_from(tmp_path, multi30k_bin, save_dir, uninterrupted,
                                          source: Path, updates: int) -> None:
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"{save_dir / 'checkpoint_last.pt'} is not usable: corrupt: record "
            in proc.stdout + proc.stderr)
    assert (f"resuming from the newest intact checkpoint instead: {source} (update {updates})"
            in proc.stdout + proc.stderr)
    assert f"Loaded checkpoint {source} (epoch 1 @ {updates} updates)" in proc.stdout
    model = load_state(save_dir / "checkpoint_last.pt")["model"]
    for key, value in uninterrupted.items():
        torch.testing.assert_close(model[key], value, rtol=0, atol=1e-6, msg=key)


def test_a_full_disk_at_a_save_is_one_line_and_the_run_resumes(multi30k_bin, tmp_path,
                                                               uninterrupted):
    """The third checkpoint file written (the save of update 20, after checkpoint_1_10.pt and
    its copy to checkpoint_last.pt) meets a full disk."""
    save_dir = tmp_path / "checkpoints"
    proc = run_wrapped(tmp_path, multi30k_bin.data_bin, save_dir, full_disk_at_write=3)
    assert proc.returncode == 1
    line = train_error_line(proc.stderr)
    assert line.startswith(f"fairseq-train: error: {save_dir / 'checkpoint_1_20.pt'}: cannot "
                           "write (no space left on device); nothing was written")
    assert sorted(p.name for p in save_dir.iterdir()) == ["checkpoint_1_10.pt",
                                                          "checkpoint_last.pt"]
    assert_resumes_to_the_same_model(tmp_path, multi30k_bin, save_dir, uninterrupted, 10)


def test_resuming_with_another_vocabulary_names_the_parameter_and_both_shapes(reference_run,
                                                                               tmp_path):
    other_bin = tmp_path / "other-bin"
    text = reference_run.text_dir
    run_fairseq("preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
        "--trainpref", text / "train", "--validpref", text / "valid", "--destdir", other_bin,
        "--thresholdsrc", "5", "--thresholdtgt", "5", "--workers", "1"])
    save_dir = tmp_path / "checkpoints"
    shutil.copytree(reference_run.checkpoint.parent, save_dir)
    before = snapshot(save_dir)
    args = [*train_args(other_bin, save_dir), "--max-update", str(MAX_UPDATE + 10)]
    proc = run_wrapped_args(tmp_path, args)
    assert proc.returncode == 1
    line = train_error_line(proc.stderr)
    size = len((other_bin / "dict.en.txt").read_text(encoding="utf-8").splitlines()) + 4
    old = reference_run.model["encoder.embed_tokens.weight"].shape[0]
    assert (f"{save_dir / 'checkpoint_last.pt'}: cannot resume: parameter "
            f"'encoder.embed_tokens.weight' has shape [{old}, 64] in the checkpoint but "
            f"[{size}, 64] in the model being trained" in line)
    assert without_lock(snapshot(save_dir)) == before


# --------------------------------------------------------------------------------------------
# Damaged checkpoints: every reader refuses them in one line


@pytest.mark.parametrize("tool", ["average", "hub", "plot_attention", "generate"])
def test_every_reader_refuses_a_checkpoint_with_flipped_bytes(tool, reference_run, tmp_path):
    bad = tmp_path / "flipped.pt"
    shutil.copyfile(reference_run.checkpoint, bad)
    flip_a_byte(bad)
    out = tmp_path / "out"
    commands = {
        "average": [*command("average_checkpoints"), "--inputs",
                    str(reference_run.checkpoint), str(bad), "--output", str(out)],
        "hub": [sys.executable, "-m", "user_plugin.hub", str(reference_run.data_bin),
                "--checkpoints", str(bad), "--source-lang", "en", "--target-lang", "de"],
        "plot_attention": [*command("plot_attention"),
                           "--checkpoint", str(bad), "--data-dir", str(reference_run.data_bin),
                           "--source", "a man .", "--out-dir", str(out)],
        "generate": [sys.executable, "-m", "fairseq_cli.generate", str(reference_run.data_bin),
                     "--user-dir", USER_DIR, "--path", str(bad), "--cpu", "--gen-subset", "test",
                     "--beam", "1"],
    }
    proc = forked_cli.run(commands[tool], input="a man .\n", cwd=REPO, env=fairseq_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "H-" not in proc.stdout
    if tool == "generate":
        line = generate_error_line(proc.stderr)
    else:
        line = one_error_line(proc.stderr)
    assert str(bad) in line and "corrupt: record" in line and "fails its CRC-32 check" in line
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# Full disks in the scripts' writers


@pytest.mark.parametrize("tool", ["average", "export", "score", "plot_attention", "prepare"])
def test_a_full_disk_is_one_line_and_leaves_nothing(tool, reference_run, tmp_path, capsys,
                                                    monkeypatch):
    """Each writer's temporary file meets a full disk (a patched ``open``): one line naming
    the destination, exit status 1, no file left behind."""
    import builtins

    real_open = builtins.open

    def open_on_a_full_disk(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "w" in str(mode) and str(file).endswith(TEMP_SUFFIX):
            return FullDisk(handle)
        return handle

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    text = tmp_path / "text.de"
    text.write_text("Ein Mann .\nZwei Hunde .\n", encoding="utf-8")
    if tool == "average":
        module, prog = average_checkpoints, average_checkpoints.PROG
        argv = ["--inputs", str(reference_run.checkpoint), "--output", str(out_dir / "avg.pt")]
        destination = out_dir / "avg.pt"
    elif tool == "export":
        module = importlib.import_module("user_plugin.commands.export")
        prog = module.PROG
        argv = [str(reference_run.checkpoint), "--data-dir", str(reference_run.data_bin), "--to",
                "fairseq", "--output", str(out_dir / "exported.pt")]
        destination = out_dir / "exported.pt"
    elif tool == "score":
        module = importlib.import_module("user_plugin.commands.score_translation")
        prog = module.PROG
        argv = ["--hyp", str(text), "--ref", str(text), "--target-lang", "de",
                "--output-json", str(out_dir / "bleu.json")]
        destination = out_dir / "bleu.json"
    elif tool == "plot_attention":
        module = importlib.import_module("user_plugin.commands.plot_attention")
        prog = module.PROG
        argv = ["--checkpoint", str(reference_run.checkpoint), "--data-dir",
                str(reference_run.data_bin), "--source", "a man .", "--target", "ein mann .",
                "--tokenized", "--out-dir", str(out_dir)]
        destination = out_dir / "encoder_self_layer1.png"
    else:
        module, prog = prepare_text, prepare_text.PROG
        argv = ["normalize", "--lang", "de", str(text), str(out_dir / "text.tok.de")]
        destination = out_dir / "text.tok.de"
    monkeypatch.setattr(builtins, "open", open_on_a_full_disk)
    monkeypatch.setattr(io, "open", open_on_a_full_disk)  # pathlib's
    status = run_main(module.main, argv, prog)
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(io, "open", real_open)
    err = capsys.readouterr().err  # the export first says what it exports
    line = one_error_line("\n".join(line for line in err.splitlines()
                                    if not line.startswith("exporting ")))
    assert status == 1
    assert line == f"{prog}: error: {destination}: cannot write (no space left on device)"
    assert list(out_dir.iterdir()) == []


def tmpfs_available() -> bool:
    probe = forked_cli.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, check=False) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


def test_averaging_onto_a_really_full_disk(reference_run, tmp_path):
    """The real command onto a 256 KiB tmpfs (mounted in a user namespace): the disk fills
    inside ``torch.save``; one line, nothing left on the disk."""
    if not tmpfs_available():
        pytest.skip("cannot mount a tmpfs here (no unprivileged user namespaces)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=256k tmpfs {disk} && "
              f"{shlex.join(command('average_checkpoints'))} --inputs "
              f"{reference_run.checkpoint} --output {disk / 'avg.pt'}; "
              f"echo status=$?; ls -A {disk}")
    proc = forked_cli.run(["unshare", "-rm", "sh", "-c", script], env=fairseq_env(),
                          capture_output=True, text=True, timeout=300)
    assert "status=1" in proc.stdout and proc.stdout.strip().endswith("status=1"), proc.stdout
    line = one_error_line(proc.stderr)
    assert line == (f"vaswani-average: error: {disk / 'avg.pt'}: cannot write "
                    "(no space left on device)")


def test_the_hub_writing_to_a_full_disk_is_one_line(reference_run):
    with open("/dev/full", "w") as full:
        proc = forked_cli.run(
            [sys.executable, "-m", "user_plugin.hub", str(reference_run.data_bin),
             "--checkpoints", str(reference_run.checkpoint), "--source-lang", "en",
             "--target-lang", "de", "--beam", "1"],
            input="a man .\n" * 50, stdout=full, stderr=subprocess.PIPE, cwd=REPO,
            env=fairseq_env(), text=True, timeout=300)
    assert proc.returncode == 1
    assert one_error_line(proc.stderr) == ("vaswani-translate: error: standard output: cannot "
                                           "write (no space left on device)")


# --------------------------------------------------------------------------------------------
# The hub: lines, encodings, subword models, dictionaries, language direction


def test_hub_keeps_one_output_line_per_input_line_whatever_the_line_contains(reference_run):
    lines = ["a man\ris walking .", "two dogs\u2028play .", "", "a\x85child\x0csits .",
             "\ufeffa woman .\t"]
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.hub", str(reference_run.data_bin), "--checkpoints",
         str(reference_run.checkpoint), "--source-lang", "en", "--target-lang", "de",
         "--beam", "1"],
        input="\n".join(lines).encode("utf-8") + b"\n", capture_output=True, cwd=REPO,
        env=fairseq_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = proc.stdout.decode("utf-8").split("\n")
    assert len(outputs) == len(lines) + 1 and outputs[-1] == ""
    assert outputs[2] == "" and all(outputs[i] for i in (0, 1, 3, 4))
    translator = hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                                     source_lang="en", target_lang="de", beam=1)
    assert outputs[1] == translator.translate("two dogs play .")  # U+2028 is a space


def test_hub_refuses_input_that_is_not_utf8_in_one_line(reference_run):
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.hub", str(reference_run.data_bin), "--checkpoints",
         str(reference_run.checkpoint), "--source-lang", "en", "--target-lang", "de"],
        input=b"a man .\nStra\xdfe .\n", capture_output=True, cwd=REPO, env=fairseq_env(),
        timeout=300)
    assert proc.returncode == 1 and proc.stdout == b""
    line = one_error_line(proc.stderr.decode("utf-8"))
    assert line == ("vaswani-translate: error: standard input: not valid UTF-8 text (line 2, "
                    "byte 12)")


def test_hub_refuses_malformed_bpe_codes_naming_the_file(reference_run, tmp_path, capsys,
                                                         monkeypatch):
    codes = tmp_path / "bpecodes"
    codes.write_text("#version: 0.2\na n\nm a n\n", encoding="utf-8")
    with pytest.raises(hub.ArtifactError) as info:
        hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                            source_lang="en", target_lang="de", bpe_codes=codes)
    assert str(info.value) == (f"cannot read BPE codes {codes}: invalid line 3 in BPE codes "
                               "file: m a n")
    monkeypatch.setattr("sys.stdin", io.StringIO("a man .\n"))
    status = run_main(translate.main, [str(reference_run.data_bin), "--checkpoints",
                                       str(reference_run.checkpoint), "--bpe-codes", str(codes),
                                       "--source-lang", "en", "--target-lang", "de"],
                      translate.PROG)
    captured = capsys.readouterr()
    assert status == 1 and captured.out == ""
    assert one_error_line(captured.err) == f"vaswani-translate: error: {info.value}"


def test_hub_refuses_a_malformed_sentencepiece_model_naming_the_file(reference_run, tmp_path):
    model = tmp_path / "spm.model"
    model.write_bytes(b"\x0a\x05hello not a model")
    with pytest.raises(hub.ArtifactError) as info:
        hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                            source_lang="en", target_lang="de", sentencepiece_model=model)
    message = str(info.value)
    assert message.startswith(f"cannot read SentencePiece model {model}: ") and "\n" not in message


def test_hub_names_the_parameter_when_the_dictionaries_do_not_fit(reference_run, tmp_path):
    for lang in ("en", "de"):
        words = (reference_run.data_bin / f"dict.{lang}.txt").read_text(encoding="utf-8")
        extra = "".join(f"extraword{i} 1\n" for i in range(8))
        (tmp_path / f"dict.{lang}.txt").write_text(words + extra, encoding="utf-8")
    with pytest.raises(hub.ArtifactError) as info:
        hub.load_translator(tmp_path, checkpoints=[reference_run.checkpoint], source_lang="en",
                            target_lang="de")
    old = reference_run.model["encoder.embed_tokens.weight"].shape[0]
    assert str(info.value) == (
        f"cannot build the model of {reference_run.checkpoint}: parameter "
        f"'encoder.embed_tokens.weight' has shape [{old}, 64] in the checkpoint but "
        f"[{old + 8}, 64] in the model for the dictionaries of {tmp_path} (another vocabulary "
        "or architecture?)")


def test_hub_warns_when_the_direction_is_not_the_checkpoints(reference_run, caplog):
    with caplog.at_level(logging.WARNING, logger="user_plugin.hub"):
        hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                            source_lang="de", target_lang="en")
    assert "translating de->en, but the checkpoint was trained en->de" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="user_plugin.hub"):
        hub.load_translator(reference_run.data_bin, checkpoints=[reference_run.checkpoint],
                            source_lang="en", target_lang="de")
    assert "translating" not in caplog.text


# --------------------------------------------------------------------------------------------
# Attention pictures of fairseq's built-in transformer


def test_plot_attention_reads_a_builtin_transformer_like_ours():
    """fairseq's ``transformer`` with our weights and positions draws the same maps as ours."""
    from conftest import fake_task

    from user_plugin.artifacts.builtin_transformer import (
        OurPositionsForFairseq,
        build_fairseq_transformer,
        copy_our_weights_into_fairseq,
    )

    plot_attention = importlib.import_module("user_plugin.commands.plot_attention")
    dictionary = make_dictionary(40)
    torch.manual_seed(0)
    ours = build_vaswani(dictionary, **TINY).eval()
    theirs = build_fairseq_transformer(ours, fake_task(dictionary)).eval()
    copy_our_weights_into_fairseq(ours, theirs)
    pad = dictionary.pad()
    theirs.encoder.embed_positions = OurPositionsForFairseq(ours.encoder.embed_positions, pad)
    theirs.decoder.embed_positions = OurPositionsForFairseq(ours.decoder.embed_positions, pad)
    src = torch.tensor([5, 6, 7, 8, dictionary.eos()])
    tgt = torch.tensor([9, 10, 11, dictionary.eos()])
    expected = plot_attention.attention_maps(ours, src, tgt, dictionary.eos())
    got = plot_attention.attention_maps(theirs, src, tgt, dictionary.eos())
    for kind in plot_attention.KINDS:
        assert len(got[kind]) == len(expected[kind]) == 2
        for mine, builtin in zip(expected[kind], got[kind]):
            assert builtin.shape == mine.shape and builtin.size(0) == 4
            torch.testing.assert_close(builtin, mine, atol=1e-5, rtol=1e-5)


def test_plot_attention_of_a_builtin_transformer_checkpoint(multi30k_bin, tmp_path):
    save_dir = tmp_path / "builtin"
    builtin_args = [arg if arg != "vaswani_base" else "transformer" for arg in TINY_MODEL_ARGS]
    run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", *builtin_args,
        *PAPER_OPTIMIZATION_ARGS, "--d-model", "64", "--max-update", "2", "--max-tokens", "1000",
        "--save-dir", save_dir, "--disable-validation", "--num-workers", "0"])
    out = tmp_path / "attention"
    proc = forked_cli.run(
        [*command("plot_attention"), "--checkpoint",
         str(save_dir / "checkpoint_last.pt"), "--data-dir", str(multi30k_bin.data_bin),
         "--source", "a man is riding a bike .", "--tokenized", "--out-dir", str(out)],
        cwd=REPO, env=fairseq_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{kind}_layer{layer}.png" for kind in ("encoder_self", "decoder_self",
                                                 "encoder_decoder") for layer in (1, 2))
