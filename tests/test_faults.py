"""Faults and bad input (issue 6): nothing is lost and every error is clear.

The matrix of what was tried, what happens and which test shows it is docs/faults.md.

Killed training runs use a wrapper script written by the tests (``WRAPPER``): it runs the real
``fairseq-train`` after installing, from environment variables, a hook that SIGKILLs the process
at a chosen point (after an update, inside ``torch.save`` of a checkpoint, inside the copy to
``checkpoint_last.pt``). The product code has no test hooks.
"""

import importlib
import io
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli import PAPER_OPTIMIZATION_ARGS, REPO, TINY_MODEL_ARGS, USER_DIR, fairseq_env, run_fairseq
from conftest import TINY, build_vaswani, make_dictionary

from user_plugin import hub
from user_plugin.files import run_main

sys.path.insert(0, str(REPO / "scripts"))
average_checkpoints = importlib.import_module("average_checkpoints")
prepare_text = importlib.import_module("prepare_text")
NOISE = ("Warning", "warnings.warn", "tensorboardX", "autocast")  # library chatter on stderr

WRAPPER = r'''
"""fairseq-train with a fault injected from the environment (written by tests/test_faults.py)."""
import os
import shutil
import signal
import sys

sys.path.insert(0, os.environ["FAULT_REPO"])


def die():
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


kill_after_update = int(os.environ.get("FAULT_KILL_AFTER_UPDATE", "0"))
kill_in_save = int(os.environ.get("FAULT_KILL_IN_SAVE", "0"))
kill_in_copy = int(os.environ.get("FAULT_KILL_IN_COPY_TO_LAST", "0"))

if os.environ.get("FAULT_FAIRSEQ_COPY") == "1":
    # the control: the plugin imported, then fairseq's own (non-atomic) copy put back
    import user_plugin.registration  # noqa: F401
    from fairseq import checkpoint_utils
    from fairseq.file_io import PathManager
    checkpoint_utils.PathManager = PathManager

if kill_after_update:
    from fairseq.trainer import Trainer
    train_step = Trainer.train_step

    def train_step_then_die(self, *args, **kwargs):
        out = train_step(self, *args, **kwargs)
        if self.get_num_updates() >= kill_after_update:
            die()
        return out

    Trainer.train_step = train_step_then_die

if kill_in_save:
    import torch
    save, calls = torch.save, [0]

    def save_half_then_die(obj, f, *args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_in_save and not isinstance(f, (str, os.PathLike)):
            f.write(b"PK\x03\x04 half a checkpoint")
            f.flush()
            die()
        return save(obj, f, *args, **kwargs)

    torch.save = save_half_then_die

if kill_in_copy:
    copyfile, copies = shutil.copyfile, [0]

    def copy_half_then_die(src, dst, *args, **kwargs):
        if "checkpoint_last.pt" in os.path.basename(str(dst)):
            copies[0] += 1
            if copies[0] == kill_in_copy:
                with open(src, "rb") as fin, open(dst, "wb") as fout:
                    fout.write(fin.read(os.path.getsize(src) // 2))
                die()
        return copyfile(src, dst, *args, **kwargs)

    shutil.copyfile = copy_half_then_die

from fairseq_cli.train import cli_main  # noqa: E402

sys.argv = ["fairseq-train", *sys.argv[1:]]
cli_main()
'''

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
    """Run fairseq-train through :data:`WRAPPER` with ``FAULT_<NAME>`` variables set."""
    wrapper = tmp_path / "train_with_fault.py"
    wrapper.write_text(WRAPPER, encoding="utf-8")
    env = fairseq_env()
    env["FAULT_REPO"] = str(REPO)
    env.update({f"FAULT_{name.upper()}": str(value) for name, value in faults.items()})
    cmd = [sys.executable, str(wrapper), *map(str, train_args(data_bin, save_dir))]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


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
    # fairseq writes checkpoint_1_20.pt.tmp and renames it: the partial file is only the .tmp
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
                       str(output)], "average_checkpoints.py")
    line = one_error_line(capsys.readouterr().err)
    assert status == 1 and str(bad) in line and BAD_KINDS[kind] in line
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_hub_refuses_a_bad_checkpoint_in_one_line(kind, reference_run, tmp_path, capsys,
                                                  monkeypatch):
    bad = bad_checkpoint(kind, tmp_path, reference_run.checkpoint)
    with pytest.raises(hub.HubError) as info:
        hub.load_translator(reference_run.data_bin, checkpoints=[bad], source_lang="en",
                            target_lang="de")
    message = str(info.value)
    assert str(bad) in message and BAD_KINDS[kind] in message and "\n" not in message
    monkeypatch.setattr("sys.stdin", io.StringIO("a man .\n"))
    status = hub.main([str(reference_run.data_bin), "--checkpoints", str(bad),
                       "--source-lang", "en", "--target-lang", "de"])
    captured = capsys.readouterr()
    assert status != 0 and captured.out == ""
    assert one_error_line(captured.err) == f"error: {message}"


@pytest.mark.parametrize("tool", ["hub", "plot_attention"])
def test_truncated_checkpoint_through_the_real_commands(tool, reference_run, tmp_path):
    """As a user runs them: exit status, one line on stderr, no traceback, nothing written."""
    bad = bad_checkpoint("truncated", tmp_path, reference_run.checkpoint)
    out_dir = tmp_path / "attention"
    if tool == "hub":
        cmd = [sys.executable, "-m", "user_plugin.hub", str(reference_run.data_bin),
               "--checkpoints", str(bad), "--source-lang", "en", "--target-lang", "de"]
    else:
        cmd = [sys.executable, str(REPO / "scripts" / "plot_attention.py"), "--checkpoint",
               str(bad), "--data-dir", str(reference_run.data_bin), "--source-lang", "en",
               "--target-lang", "de", "--source", "a man .", "--out-dir", str(out_dir)]
    proc = subprocess.run(cmd, input="a man .\n", cwd=REPO, env=fairseq_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and proc.stdout == ""
    line = one_error_line(proc.stderr)
    assert str(bad) in line and "truncated" in line
    assert not out_dir.exists()


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
                      "average_checkpoints.py")
    line = one_error_line(capsys.readouterr().err)
    assert status == 1 and str(other) in line and words in line
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]


# --------------------------------------------------------------------------------------------
# Corpora: sides of different lengths, empty files, a missing side (scripts/prepare_text.py)


def prepare(argv: list, capsys) -> tuple:
    status = run_main(prepare_text.main, [str(a) for a in argv], "prepare_text.py")
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
    proc = subprocess.run(cmd, input="\n".join(lines) + "\n", env=fairseq_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sources = [line.split("\t")[1] if "\t" in line else ""
               for line in proc.stdout.splitlines() if line.startswith("S-")]
    ids = [int(line.split("\t")[0][2:]) for line in proc.stdout.splitlines()
           if line.startswith("H-")]
    assert ids == [0, 1, 2, 3]
    assert sources == lines
