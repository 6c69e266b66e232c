"""Faults by class: an output never replaces an input, text files as they come, paths as users
write them, identity by content (a training fingerprint in every checkpoint), one line with the
right cause.

The matrix of cases, outcomes and tests is docs/faults.md. Files that a refused command must
leave alone are compared by sha256 before and after (``fault_injection.snapshot``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import REPO, command
from conftest import TINY, build_vaswani, make_dictionary
from fault_injection import snapshot

from user_plugin.commands import average_checkpoints, score_translation
from user_plugin.files import UserError, atomic_write_text, refuse_input_clash, run_main

NOISE = ("Warning", "warnings.warn", "tensorboardX", "autocast")


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if not any(n in line for n in NOISE)]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def tiny_checkpoint(path: Path, vocabulary: int = 20, seed: int = 0, **extra) -> Path:
    torch.manual_seed(seed)
    model = build_vaswani(make_dictionary(vocabulary), **TINY)
    config = {"model": {"_name": "vaswani_base", **TINY}}
    torch.save({"model": model.state_dict(), "cfg": config, **extra}, path)
    return path


def average(argv: list, capsys) -> tuple[int, str]:
    status = run_main(average_checkpoints.main, [str(a) for a in argv], average_checkpoints.PROG)
    return status, capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# An output never replaces an input


@pytest.mark.parametrize("how", ["same path", "relative path", "symbolic link", "hard link"])
def test_averaging_onto_one_of_its_inputs_is_refused_and_changes_nothing(how, tmp_path, capsys,
                                                                         monkeypatch):
    a = tiny_checkpoint(tmp_path / "checkpoint_last.pt", seed=1)
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2)
    output = {"same path": a, "relative path": Path("sub/../checkpoint_last.pt"),
              "symbolic link": tmp_path / "link.pt", "hard link": tmp_path / "hard.pt"}[how]
    (tmp_path / "sub").mkdir()
    if how == "symbolic link":
        output.symlink_to(a)
    elif how == "hard link":
        os.link(a, output)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    status, err = average(["--inputs", a, b, "--output", output], capsys)
    line = one_error_line(err)
    assert status == 1 and "is also an input" in line and "nothing was written" in line
    assert snapshot(tmp_path) == before


def test_averaging_onto_a_training_checkpoint_is_refused(tmp_path, capsys):
    inputs = tmp_path / "run"
    inputs.mkdir()
    for update in (10, 20):
        tiny_checkpoint(inputs / f"checkpoint_1_{update}.pt", seed=update)
    last = tiny_checkpoint(inputs / "checkpoint_last.pt", last_optimizer_state={"step": 20})
    before = snapshot(tmp_path)
    status, err = average(["--inputs", inputs, "--num-update-checkpoints", "2",
                           "--output", last], capsys)
    line = one_error_line(err)
    assert status == 1 and "is a training checkpoint" in line
    assert snapshot(tmp_path) == before
    status, _ = average(["--inputs", inputs, "--num-update-checkpoints", "2",
                         "--output", inputs / "avg.pt"], capsys)
    assert status == 0 and (inputs / "avg.pt").is_file()


def test_the_clash_check_of_the_writing_layer(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("keep me\n", encoding="utf-8")
    with pytest.raises(UserError, match="is also an input"):
        atomic_write_text(tmp_path / "." / "in.txt", "new\n", inputs=[source])
    assert source.read_text(encoding="utf-8") == "keep me\n"
    refuse_input_clash(tmp_path / "other.txt", [source])  # not a clash: no error
    refuse_input_clash(tmp_path / "missing.txt", [tmp_path / "missing-too.txt"])


def test_scoring_into_its_own_reference_is_refused(tmp_path, capsys):
    ref = tmp_path / "ref.de"
    ref.write_text("Ein Hund läuft .\n", encoding="utf-8")
    before = snapshot(tmp_path)
    status = run_main(score_translation.main, ["--hyp", str(ref), "--ref", str(ref),
                                               "--target-lang", "de", "--output-json", str(ref)],
                      score_translation.PROG)
    line = one_error_line(capsys.readouterr().err)
    assert status == 1 and "is also an input" in line
    assert snapshot(tmp_path) == before


def test_export_onto_its_input_checkpoint_is_refused(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "checkpoint_avg.pt")
    before = snapshot(tmp_path)
    for target in ("fairseq", "ctranslate2"):
        proc = forked_cli.run(
            [sys.executable, "-m", "user_plugin.export", str(checkpoint), "--data-dir",
             str(tmp_path), "--to", target, "--output", str(checkpoint)],
            cwd=REPO, capture_output=True, text=True, check=False,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = one_error_line(proc.stderr)
        assert proc.returncode == 1 and "is also an input" in line, target
        assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------------------------
# Text files as they come: a byte-order mark is not text


BOM = "\ufeff"


def test_a_reference_starting_with_a_bom_scores_as_without_it(tmp_path):
    text = "Ein Hund läuft über die Wiese .\nZwei Männer spielen Fußball .\n"
    plain, marked, joined = tmp_path / "plain.de", tmp_path / "marked.de", tmp_path / "joined.de"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(BOM + text, encoding="utf-8")
    joined.write_text(BOM + text + BOM + text, encoding="utf-8")  # two files joined with cat
    doubled = tmp_path / "doubled.de"
    doubled.write_text(text + text, encoding="utf-8")
    for hyp, ref in ((plain, marked), (marked, marked), (marked, plain), (doubled, joined)):
        tokenized, sacre, _ = score_translation.score_files(hyp, ref, "de")
        assert tokenized.score == pytest.approx(100.0), (hyp.name, ref.name)
        assert sacre.score == pytest.approx(100.0), (hyp.name, ref.name)


def test_every_line_reader_drops_a_bom_at_the_start(tmp_path):
    from user_plugin.files import decode_lines, iter_lines, read_lines

    path = tmp_path / "src.en"
    path.write_bytes((BOM + "A dog runs .\nTwo men .\n").encode("utf-8"))
    assert list(iter_lines(path)) == ["A dog runs .", "Two men ."]
    assert read_lines(path) == ["A dog runs .", "Two men ."]
    assert decode_lines(path.read_bytes(), "standard input") == ["A dog runs .", "Two men ."]


# --------------------------------------------------------------------------------------------
# Paths as users write them: spaces and non-ASCII letters in every directory of the recipes


def small_raw_dir(raw: Path, train: int = 400, valid: int = 40, test: int = 30) -> None:
    """A RAW_DIR of Multi30k slices; the training source and the test reference start with a
    byte-order mark, as some editors write them."""
    from conftest import MULTI30K, require_data

    require_data(MULTI30K)
    raw.mkdir(parents=True)
    for split, name, count in (("train", "train", train), ("valid", "val", valid),
                               ("test", "test_2016_flickr", test)):
        for lang in ("en", "de"):
            lines = (MULTI30K / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()
            mark = BOM if (split, lang) in {("train", "en"), ("test", "de")} else ""
            (raw / f"{split}.{lang}").write_text(mark + "\n".join(lines[:count]) + "\n",
                                                 encoding="utf-8")


@pytest.fixture(scope="module")
def spaced_chain(tmp_path_factory):
    """The whole EN-DE chain (prepare -> score) with a space and a non-ASCII letter in RAW_DIR,
    WORK_DIR (hence the data-bin, the run, the save dir) and a tiny model, 20 updates."""
    from test_recipes import TINY_MODEL_ARGS, generation_task, recipe_env

    root = tmp_path_factory.mktemp("paths") / "my rüns" / "wmt14 ende"
    small_raw_dir(root / "raw dätä")
    env = recipe_env(
        RAW_DIR=root / "raw dätä", WORK_DIR=root / "wörk dir", BPE_OPS=200, DEVICE="cpu",
        MAX_UPDATE=20, WARMUP_UPDATES=10, MAX_TOKENS=2048, TOKENS_PER_STEP=2048,
        SAVE_INTERVAL_UPDATES=10, AVERAGE_LAST=2, LOG_INTERVAL=10, WORKERS=1,
        EXTRA_ARGS=TINY_MODEL_ARGS, TASK=generation_task(), TENSORBOARD_DIR="none")
    return root, env


def test_the_recipe_chain_runs_with_spaces_and_non_ascii_letters_and_a_rerun_skips_all(
        spaced_chain):
    from test_recipes import RUN_ALL, STEPS, output_mtimes, run_script

    root, env = spaced_chain
    run_script(RUN_ALL, env, "wmt14_en_de", timeout=900)
    work = root / "wörk dir"
    dirs = [work / d for d in ("prepared", "data-bin", "base/checkpoints", "base/average",
                               "base/generate", "base/score")]
    for step_dir in dirs:
        assert (step_dir / ".done").is_file(), step_dir
    assert "upstream " + str(work / "prepared") + " " in (work / "data-bin/.done").read_text()
    prepared = work / "prepared"
    assert not (prepared / "train.en").read_text(encoding="utf-8").startswith(BOM)
    scores = (work / "base/score/bleu.json").read_text(encoding="utf-8")
    assert '"num_sentences": 30' in scores
    before = {d: output_mtimes(d) for d in dirs}
    result = run_script(RUN_ALL, env, "wmt14_en_de")
    assert result.stderr.count("skipping") == len(STEPS), result.stderr
    assert {d: output_mtimes(d) for d in dirs} == before


def test_a_step_is_the_bytes_it_wrote_and_a_bad_decoding_setting_loses_nothing(spaced_chain):
    """A data step redone into the same bytes leaves the training finished (it was started over,
    its checkpoints deleted); the score step reads its reference by content (an edited one kept
    the old score); a beam out of range is refused before the generate step empties its
    directory (its outputs were deleted, then the value refused)."""
    from test_recipes import output_mtimes, run_script, step_script

    root, env = spaced_chain
    work = root / "wörk dir"
    checkpoints, generated = work / "base" / "checkpoints", work / "base" / "generate"
    trained, decoded = output_mtimes(checkpoints), output_mtimes(generated)
    (work / "data-bin" / ".done").unlink()
    redone = run_script(step_script("binarize"), env, "wmt14_en_de")
    assert "binarizing" in redone.stderr
    result = run_script(step_script("train"), env, "wmt14_en_de")
    assert "starting over" not in result.stderr, result.stderr
    assert output_mtimes(checkpoints) == trained

    bad = run_script(step_script("generate"), {**env, "BEAM": "0"}, "wmt14_en_de", check=False)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].endswith(
        "BEAM: must be an integer from 1 to 1000 (hypotheses kept per sentence), got 0")
    assert output_mtimes(generated) == decoded

    reference = work / "prepared" / "test.ref.de"
    text = reference.read_text(encoding="utf-8")
    try:
        reference.write_text(text.replace("ein", "EIN", 1), encoding="utf-8")  # the same size
        result = run_script(step_script("score"), env, "wmt14_en_de")
        assert f"its input {reference} was redone or changed" in result.stderr
    finally:
        reference.write_text(text, encoding="utf-8")
    result = run_script(step_script("score"), env, "wmt14_en_de")
    assert "already done" not in result.stderr  # scored again against the restored reference


def test_prepare_notices_an_edited_raw_file_by_its_content(spaced_chain):
    from test_recipes import run_script, step_script

    root, env = spaced_chain
    prepared = root / "wörk dir" / "prepared"
    reference = root / "raw dätä" / "test.de"
    run_script(step_script("prepare"), env, "wmt14_en_de")  # done (or skipped) before the edit
    text = reference.read_text(encoding="utf-8")
    edited = text.replace("ein", "EIN", 1)  # same size, other content
    assert edited != text and len(edited.encode("utf-8")) == reference.stat().st_size
    reference.write_text(edited, encoding="utf-8")
    # a trained run was trained on the prepared data: redoing it needs START_OVER=1
    refused = run_script(step_script("prepare"), env, "wmt14_en_de", check=False)
    assert refused.returncode == 1 and "START_OVER=1" in refused.stderr
    result = run_script(step_script("prepare"), {**env, "START_OVER": "1"}, "wmt14_en_de")
    assert f"its input {reference} was redone or changed" in result.stderr
    assert (prepared / "test.ref.de").read_text(encoding="utf-8").removeprefix(BOM) == \
        edited.removeprefix(BOM)
    result = run_script(step_script("prepare"), env, "wmt14_en_de")
    assert "already done" in result.stderr


@pytest.mark.parametrize("name, value, words", [
    ("WORK_DIR", "/tmp/a:b", "must not contain ':'"),
    ("DATA_BIN", "/tmp/x\ny", "must not contain a line break"),
])
def test_paths_fairseq_cannot_take_are_refused_in_one_line(name, value, words):
    from test_recipes import recipe_env, run_script, step_script

    env = recipe_env(**{name: value})
    result = run_script(step_script("binarize"), env, "wmt14_en_de", check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"{name} {words}" in result.stderr


# --------------------------------------------------------------------------------------------
# Identity by content: the training fingerprint in every checkpoint


def fingerprint_of(order: list[str], source: str = "en", target: str = "de") -> dict:
    from user_plugin.artifacts.fingerprint import fingerprint

    return fingerprint(source, target, order, order)


WORDS = ["<s>", "<pad>", "</s>", "<unk>", *[f"w{i}" for i in range(16)]]
REORDERED = [*WORDS[:4], WORDS[5], WORDS[4], *WORDS[6:]]  # same size, two tokens swapped


@pytest.mark.parametrize("other", ["reordered", "swapped"])
def test_averaging_refuses_checkpoints_of_other_training_data(other, tmp_path, capsys):
    from user_plugin.artifacts.fingerprint import KEY, describe

    mine = fingerprint_of(WORDS)
    theirs = fingerprint_of(REORDERED) if other == "reordered" else \
        fingerprint_of(WORDS, "de", "en")
    a = tiny_checkpoint(tmp_path / "a.pt", seed=1, **{KEY: mine})
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2, **{KEY: theirs})
    before = snapshot(tmp_path)
    status, err = average(["--inputs", a, b, "--output", tmp_path / "avg.pt"], capsys)
    line = one_error_line(err)
    assert status == 1 and describe(mine) in line and describe(theirs) in line
    assert snapshot(tmp_path) == before


def test_averaging_keeps_a_matching_fingerprint_and_notes_a_missing_one(tmp_path, capsys):
    from user_plugin.artifacts.fingerprint import KEY

    mine = fingerprint_of(WORDS)
    a = tiny_checkpoint(tmp_path / "a.pt", seed=1, **{KEY: mine})
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2, **{KEY: mine})
    old = tiny_checkpoint(tmp_path / "old.pt", seed=3)
    status, err = average(["--inputs", a, b, "--output", tmp_path / "ab.pt"], capsys)
    assert status == 0 and "note" not in err
    assert torch.load(tmp_path / "ab.pt", weights_only=True)[KEY] == mine
    status, err = average(["--inputs", a, old, "--output", tmp_path / "a-old.pt"], capsys)
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert status == 0 and len(notes) == 1 and str(old) in notes[0]
    assert "cannot be checked" in notes[0]


def run_cli(tool: str, args: list) -> subprocess.CompletedProcess:
    from cli import fairseq_env

    return forked_cli.run([sys.executable, "-m", f"fairseq_cli.{tool}", *map(str, args)],
                          cwd=REPO, env=fairseq_env(), capture_output=True, text=True,
                          timeout=600, check=False)


def test_data_binarized_with_larger_dictionaries_is_one_line(trained_multi30k, tmp_path):
    """Dictionaries with fewer entries than the binarized files' ids ended training with our
    task in the embedding's IndexError."""
    smaller = tmp_path / "smaller dictionaries"
    shutil.copytree(trained_multi30k.data_bin, smaller)
    for lang in ("en", "de"):
        path = smaller / f"dict.{lang}.txt"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[:len(lines) // 2]), encoding="utf-8")
    args = train_into(trained_multi30k, tmp_path / "checkpoints", "--task",
                      "vaswani_translation")
    args[0] = str(smaller)
    proc = run_cli("train", args)
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and f"{smaller}: the valid split's source tokens go up to id" \
        in line and "the files were binarized with other dictionaries" in line, line
    assert not (tmp_path / "checkpoints").exists() or \
        not list((tmp_path / "checkpoints").glob("*.pt"))


def test_interactive_refuses_input_that_is_not_utf8_in_one_line(trained_multi30k, tmp_path):
    """Standard input's bytes that are no UTF-8 became unknown words, translated without a
    word said; a file given by --input ended in a traceback."""
    from cli import fairseq_env

    bad = b"Two dogs .\n\xff\xfe bad\n"
    (tmp_path / "bad.txt").write_bytes(bad)
    args = [sys.executable, "-m", "fairseq_cli.interactive", str(trained_multi30k.data_bin),
            "--user-dir", "user_plugin", "--task", "vaswani_translation", "--cpu", "--path",
            str(trained_multi30k.checkpoint_dir / "checkpoint_last.pt")]
    for extra, stdin in (([], bad), (["--input", str(tmp_path / "bad.txt")], b"")):
        proc = forked_cli.run([*args, *extra], cwd=REPO, env=fairseq_env(), input=stdin,
                              capture_output=True, timeout=600, check=False)
        stderr = proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 1 and error_line(stderr).endswith(
            "the input is not valid UTF-8 text (byte 0xff cannot start or continue a "
            "character): give UTF-8 text"), stderr[-2000:]
        assert b"H-" not in proc.stdout  # nothing translated


def reordered_data_bin(data_bin: Path, destination: Path) -> Path:
    """A copy of a joined-dictionary data-bin whose dictionaries hold the same tokens in
    another order (two entries swapped): same size, so the same tensor shapes."""
    shutil.copytree(data_bin, destination)
    for lang in ("en", "de"):
        path = destination / f"dict.{lang}.txt"
        lines = path.read_text(encoding="utf-8").splitlines()
        lines[10], lines[11] = lines[11], lines[10]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return destination


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if ": error: " in line]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_checkpoints_store_the_training_fingerprint(trained_multi30k):
    from user_plugin.artifacts.fingerprint import KEY, dictionary_sha256

    state = torch.load(trained_multi30k.checkpoint_dir / "checkpoint_last.pt",
                       weights_only=True, map_location="cpu")
    symbols = ["<s>", "<pad>", "</s>", "<unk>"] + [
        line.rsplit(" ", 1)[0] for line in
        (trained_multi30k.data_bin / "dict.en.txt").read_text(encoding="utf-8").splitlines()]
    stored = state[KEY]
    assert (stored["source_lang"], stored["target_lang"]) == ("en", "de")
    assert stored["source_dictionary"] == stored["target_dictionary"]
    assert stored["source_dictionary"] == dictionary_sha256(symbols)


@pytest.mark.parametrize("change", ["reordered dictionary", "swapped languages"])
def test_resuming_on_other_training_data_is_refused_naming_both_fingerprints(
        change, trained_multi30k, tmp_path):
    from user_plugin.artifacts.fingerprint import KEY, describe

    save_dir = tmp_path / "checkpoints"
    shutil.copytree(trained_multi30k.checkpoint_dir, save_dir,
                    ignore=shutil.ignore_patterns("*.lock"))
    args = list(trained_multi30k.train_args)
    args[args.index("--save-dir") + 1] = str(save_dir)
    args[args.index("--max-update") + 1] = "80"
    if change == "reordered dictionary":
        args[0] = str(reordered_data_bin(trained_multi30k.data_bin, tmp_path / "reordered"))
    else:
        args += ["--source-lang", "de", "--target-lang", "en"]
    before = snapshot(save_dir)
    proc = run_cli("train", args)
    assert proc.returncode == 1
    line = error_line(proc.stderr)
    stored = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)[KEY]
    assert "cannot resume" in line and describe(stored) in line
    assert ("another language direction" if change == "swapped languages"
            else "other dictionaries") in line
    assert {k: v for k, v in snapshot(save_dir).items() if "lock" not in k} == \
        {k: v for k, v in before.items() if "lock" not in k}


def test_generate_refuses_mismatched_ensembles_and_dictionaries_and_notes_old_checkpoints(
        trained_multi30k, tmp_path):
    from user_plugin.artifacts.fingerprint import KEY

    checkpoints = trained_multi30k.checkpoint_dir
    last = checkpoints / "checkpoint_last.pt"
    state = torch.load(last, weights_only=True, map_location="cpu")
    other = tmp_path / "other.pt"
    torch.save({**state, KEY: {**state[KEY], "target_dictionary": "0" * 64}}, other)
    old = tmp_path / "old.pt"
    torch.save({key: value for key, value in state.items() if key != KEY}, old)
    common = ["--user-dir", "user_plugin", "--cpu", "--gen-subset", "test", "--beam", "1",
              "--max-tokens", "4000", "--max-len-b", "5", "--max-len-a", "0",
              "--skip-invalid-size-inputs-valid-test"]
    proc = run_cli("generate", [trained_multi30k.data_bin, "--path", f"{last}:{other}",
                                *common])
    line = error_line(proc.stderr)
    assert proc.returncode != 0 and "cannot be used together" in line and str(other) in line
    reordered = reordered_data_bin(trained_multi30k.data_bin, tmp_path / "reordered")
    proc = run_cli("generate", [reordered, "--path", last, *common])
    line = error_line(proc.stderr)
    assert proc.returncode != 0 and "dictionary differs (other tokens" in line
    proc = run_cli("generate", [trained_multi30k.data_bin, "--path", f"{last}:{last}", *common])
    assert proc.returncode == 0 and "cannot be checked" not in proc.stderr, proc.stderr[-2000:]
    proc = run_cli("generate", [trained_multi30k.data_bin, "--path", old, *common])
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [line for line in proc.stderr.splitlines() if "cannot be checked" in line]
    assert len(notes) == 1 and str(old) in notes[0]
    # dictionaries of another size over the same data: one line, not the load's traceback
    bigger = tmp_path / "bigger dictionaries"
    shutil.copytree(trained_multi30k.data_bin, bigger)
    for lang in ("en", "de"):
        with open(bigger / f"dict.{lang}.txt", "a", encoding="utf-8") as handle:
            handle.write("".join(f"extraword{i} 1\n" for i in range(8)))
    proc = run_cli("generate", [bigger, "--path", last, *common])
    rows = state["model"]["encoder.embed_tokens.weight"].shape[0]
    assert proc.returncode == 1 and error_line(proc.stderr).endswith(
        f"cannot use {last} with the dictionaries of {bigger}: its source embedding has {rows} "
        f"rows, the source dictionary {rows + 8} entries: another vocabulary")
    # the other direction decodes (fairseq's commands do what the task names), with a warning
    proc = run_cli("generate", [trained_multi30k.data_bin, "--path", last, "-s", "de", "-t",
                                "en", *common])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{last} was trained en->de; this run's task is de->en" in proc.stderr


# --------------------------------------------------------------------------------------------
# One line, and the right cause


def train_into(trained, save_dir: Path, *extra: str) -> list:
    args = list(trained.train_args)
    args[args.index("--save-dir") + 1] = str(save_dir)
    args[args.index("--max-update") + 1] = "80"
    return [*args, *extra]


def test_max_tokens_below_the_longest_sentence_is_one_line(trained_multi30k, tmp_path):
    args = train_into(trained_multi30k, tmp_path / "checkpoints")
    args[args.index("--max-tokens") + 1] = "10"
    proc = run_cli("train", args)
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and "a sentence is longer than --max-tokens 10" in line
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_resuming_with_another_layout_is_one_line_and_changes_nothing(trained_multi30k,
                                                                      tmp_path):
    save_dir = tmp_path / "checkpoints"
    shutil.copytree(trained_multi30k.checkpoint_dir, save_dir,
                    ignore=shutil.ignore_patterns("*.lock"))
    before = snapshot(save_dir)
    proc = run_cli("train", train_into(trained_multi30k, save_dir, "--encoder-normalize-before"))
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and proc.stderr.count("Traceback") == 0
    assert (f"cannot resume: {save_dir / 'checkpoint_last.pt'} was trained with no "
            "--encoder-normalize-before but this run with --encoder-normalize-before") in line
    assert {k: v for k, v in snapshot(save_dir).items() if "lock" not in k} == \
        {k: v for k, v in before.items() if "lock" not in k}
    # fairseq's own transformer, whose configuration is an argparse namespace, the same sizes
    args = train_into(trained_multi30k, save_dir)
    args[args.index("--arch") + 1] = "transformer"
    proc = run_cli("train", args)
    assert proc.returncode == 1 and proc.stderr.count("Traceback") == 0, proc.stderr[-3000:]
    assert str(save_dir / "checkpoint_last.pt") in error_line(proc.stderr)
    assert {k: v for k, v in snapshot(save_dir).items() if "lock" not in k} == \
        {k: v for k, v in before.items() if "lock" not in k}


@pytest.mark.parametrize("data, words", [
    ("fr", "has no dict.fr.txt: it holds no fr data (its dictionaries' languages: de, en)"),
    ("missing", "no such file or directory"),
])
def test_data_the_command_cannot_find_is_one_line(data, words, trained_multi30k, tmp_path):
    args = train_into(trained_multi30k, tmp_path / "checkpoints")
    if data == "fr":
        args += ["--source-lang", "en", "--target-lang", "fr"]
    else:
        args[0] = str(tmp_path / "no-such-data-bin")
    proc = run_cli("train", args)
    assert proc.returncode == 1 and words in error_line(proc.stderr)


@pytest.mark.parametrize("damage, words", [
    ("empty", "dict.de.txt: an empty dictionary"),
    ("cut at a line end", "dict.de.txt: holds only the first 100 of the"),
    ("cut inside a line", "dict.de.txt: line 101 is not '<token> <count>' (the file is cut?)"),
])
def test_an_empty_or_cut_dictionary_is_named_as_such(damage, words, trained_multi30k, tmp_path):
    data = tmp_path / "data-bin"
    shutil.copytree(trained_multi30k.data_bin, data)
    path = data / "dict.de.txt"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text({"empty": "", "cut at a line end": "".join(lines[:100]),
                     "cut inside a line": "".join(lines[:100]) + lines[100].split(" ")[0]
                     }[damage], encoding="utf-8")
    proc = run_cli("generate", [data, "--user-dir", "user_plugin", "--task",
                                "vaswani_translation", "--path",
                                trained_multi30k.checkpoint_dir / "checkpoint_last.pt", "--cpu",
                                "--max-tokens", "2000"])
    line = error_line(proc.stderr)
    assert proc.returncode != 0 and words in line and "joined dictionary" not in line


def test_hub_beam_0_blames_the_beam(trained_multi30k):
    proc = forked_cli.run([sys.executable, "-m", "user_plugin.hub",
                           str(trained_multi30k.checkpoint_dir), "--beam", "0"],
                          cwd=REPO, input="", capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --beam: must be an integer from 1 to 1000" in proc.stderr and "nbest" not in \
        proc.stderr.splitlines()[-1]


def test_export_refuses_bpe_codes_that_do_not_fit_the_dictionaries(trained_multi30k, tmp_path):
    codes = tmp_path / "codes"
    lines = ["#version: 0.2", *[f"q{i} z{i}</w>" for i in range(50)]]
    codes.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "export"
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.export",
         str(trained_multi30k.checkpoint_dir / "checkpoint_last.pt"), "--data-dir",
         str(trained_multi30k.data_bin), "--to", "ctranslate2", "--output", str(output),
         "--bpe-codes", str(codes)],
        cwd=REPO, capture_output=True, text=True, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = one_error_line(proc.stderr.split("\n", 1)[1])  # after "exporting ..."
    assert proc.returncode == 1 and "only 0 of the 50 subwords" in line
    assert not output.exists()


# --------------------------------------------------------------------------------------------
# Cases of the adversarial round (docs/faults.md lists them all)


@pytest.mark.parametrize("setting", [
    {"DATA_BIN": "{work}"}, {"DATA_BIN": "/"}, {"DATA_BIN": "{work}/prepared"},
    {"RAW_DIR": "{work}/prepared"}, {"RUN_DIR": "{work}/prepared"}, {"DATA_BIN": "{home}"},
])
def test_a_step_directory_that_holds_other_work_is_refused_and_nothing_is_removed(setting,
                                                                                  tmp_path):
    from test_recipes import recipe_env, run_script, step_script

    work, home = tmp_path / "work", tmp_path / "home"
    (work / "prepared").mkdir(parents=True)
    home.mkdir()
    (work / "prepared" / "keep.txt").write_text("prepared text\n", encoding="utf-8")
    (home / "notes.txt").write_text("mine\n", encoding="utf-8")
    env = recipe_env(WORK_DIR=work, HOME=home, **{
        name: value.format(work=work, home=home) for name, value in setting.items()})
    before = snapshot(tmp_path)
    for step in ("prepare", "binarize"):
        result = run_script(step_script(step), env, "wmt14_en_de", check=False)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert "choose DATA_BIN, RUN_DIR, WORK_DIR and RAW_DIR apart" in result.stderr
    assert snapshot(tmp_path) == before


def test_max_update_0_is_refused(tmp_path):
    from test_recipes import recipe_env, run_script, step_script

    result = run_script(step_script("train"), recipe_env(WORK_DIR=tmp_path, MAX_UPDATE=0),
                        "wmt14_en_de", check=False)
    assert result.returncode == 1 and "MAX_UPDATE must be positive" in result.stderr


def test_averaging_one_checkpoint_twice_through_a_hard_link_uses_it_once(tmp_path, capsys):
    a = tiny_checkpoint(tmp_path / "a.pt")
    os.link(a, tmp_path / "same.pt")
    status, err = average(["--inputs", a, tmp_path / "same.pt", "--output", tmp_path / "o.pt"],
                          capsys)
    assert status == 0 and f"{tmp_path / 'same.pt'} holds the same parameters as {a}" in err
    assert torch.load(tmp_path / "o.pt", weights_only=True)["averaged_from"] == ["a.pt"]


def test_an_empty_output_name_is_refused(tmp_path, capsys):
    a, b = tiny_checkpoint(tmp_path / "a.pt", seed=1), tiny_checkpoint(tmp_path / "b.pt", seed=2)
    before = snapshot(tmp_path)
    status, err = average(["--inputs", a, b, "--output", ""], capsys)
    assert status == 1 and "not a file name to write to" in one_error_line(err)
    assert snapshot(tmp_path) == before


def test_prepare_text_never_writes_over_its_input(tmp_path):
    text = tmp_path / "train.de"
    text.write_text("Ein  Hund „läuft“ .\n", encoding="utf-8")
    before = snapshot(tmp_path)
    for argv in (["normalize", "--lang", "de", text, text],
                 ["detokenize", "--lang", "de", text, text]):
        proc = forked_cli.run([*command("prepare_text"), *map(str, argv)], capture_output=True,
                              text=True, check=False)
        assert proc.returncode == 1 and "is also an input" in one_error_line(proc.stderr)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("option", ["--lenpen", "--temperature", "--sampling-topp"])
def test_hub_refuses_numbers_that_are_not_finite(option, tmp_path):
    proc = forked_cli.run([sys.executable, "-m", "user_plugin.hub", str(tmp_path), option,
                           "nan"], cwd=REPO, input="", capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and f"argument {option}: must be a number " in proc.stderr
    assert "got 'nan'" in proc.stderr or "got nan" in proc.stderr


def test_export_never_writes_over_a_dictionary_it_reads(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "checkpoint.pt")
    data = tmp_path / "data-bin"
    data.mkdir()
    (data / "dict.en.txt").write_text("a 1\n", encoding="utf-8")
    before = snapshot(tmp_path)
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.export", str(checkpoint), "--data-dir", str(data),
         "--to", "fairseq", "--output", str(data / "dict.en.txt")],
        cwd=REPO, capture_output=True, text=True, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and "is also an input" in one_error_line(proc.stderr)
    assert snapshot(tmp_path) == before


def test_one_language_given_alone_is_refused_by_the_papers_task(trained_multi30k):
    proc = run_cli("generate", [trained_multi30k.data_bin, "--user-dir", "user_plugin",
                                "--task", "vaswani_translation", "--target-lang", "fr",
                                "--path", trained_multi30k.checkpoint_dir / "checkpoint_last.pt",
                                "--cpu", "--max-tokens", "2000"])
    line = error_line(proc.stderr)
    assert proc.returncode != 0 and "--target-lang fr was given alone" in line
    assert "holds en-de data" in line


def test_hub_refuses_a_top_p_that_is_no_probability(tmp_path):
    proc = forked_cli.run([sys.executable, "-m", "user_plugin.hub", str(tmp_path), "--sampling",
                           "--sampling-topp", "2"], cwd=REPO, input="", capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 2 and "argument --sampling-topp: must be a number in (0, 1], or " \
        "-1 for none" in proc.stderr


def test_generate_given_a_directory_as_checkpoint_is_one_line(trained_multi30k):
    proc = run_cli("generate", [trained_multi30k.data_bin, "--user-dir", "user_plugin",
                                "--path", trained_multi30k.checkpoint_dir, "--cpu"])
    line = error_line(proc.stderr)
    assert proc.returncode != 0 and f"{trained_multi30k.checkpoint_dir}: is a directory" in line


def test_hub_and_export_refuse_checkpoints_of_other_training_data(trained_multi30k, tmp_path):
    from user_plugin import hub
    from user_plugin.artifacts.fingerprint import KEY, describe

    last = trained_multi30k.checkpoint_dir / "checkpoint_last.pt"
    state = torch.load(last, weights_only=True, map_location="cpu")
    swapped = tmp_path / "swapped.pt"
    torch.save({**state, KEY: {**state[KEY], "source_lang": "de", "target_lang": "en"}},
               swapped)
    with pytest.raises(hub.ArtifactError) as info:
        hub.load_translator(trained_multi30k.data_bin, checkpoints=[last, swapped],
                            source_lang="en", target_lang="de")
    assert "cannot be used together" in str(info.value)
    assert describe(state[KEY]) in str(info.value) and "another language direction" in \
        str(info.value)
    reordered = reordered_data_bin(trained_multi30k.data_bin, tmp_path / "reordered")
    before = snapshot(tmp_path)
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.export", str(last), "--data-dir", str(reordered),
         "--to", "fairseq", "--output", str(tmp_path / "exported.pt")],
        cwd=REPO, capture_output=True, text=True, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and "dictionary differs" in line and describe(state[KEY]) in line
    assert snapshot(tmp_path) == before


def test_a_raw_dir_that_is_not_a_directory_is_named_as_given(tmp_path):
    from test_recipes import recipe_env, run_script, step_script

    missing = tmp_path / "no such raw dir ü"
    result = run_script(step_script("prepare"), recipe_env(RAW_DIR=missing, WORK_DIR=tmp_path),
                        "wmt14_en_de", check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"RAW_DIR '{missing}' is not a directory" in result.stderr
