"""The WMT14 shell recipes (paper §5.1, §6.1) and their Python text helpers.

* ``vaswani-prepare-text``: cleaning rule, hypothesis order, SGM extraction, tokenisation
  round trip, one-line errors (no data needed);
* the step markers of ``recipes/common.sh``: skip when done, redo when an output or an upstream
  step changed;
* the recipes' entry points: one script per step (``recipes/steps/<step>.sh PAIR``) and
  ``recipes/run_all.sh PAIR`` for the language pairs of ``recipes/pairs/``; the paper's
  settings read from ``user_plugin/paper.py``;
* the EN-DE chain (BPE) end to end through an offline mirror of ``../shared/data`` with a tiny
  model and all 3003 newstest2014 sentences, the EN-FR chain (SentencePiece) on the small EN-FR
  sample, and resuming: a finished step is skipped, a partly deleted one is redone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked_cli
import pytest
from cli import command, fairseq_env
from conftest import REPO, SHARED_DATA, require_data

from user_plugin.commands import prepare_text
from user_plugin.files import run_main

RECIPES = REPO / "recipes"
RUN_ALL = RECIPES / "run_all.sh"
SCRIPTS = REPO / "scripts"
STEPS = ["prepare", "binarize", "train", "average", "generate", "score", "package"]
# Settings the recipes read; a value in the caller's environment must not leak into a test.
RECIPE_VARIABLES = {
    "WORK_DIR", "RAW_DIR", "DOWNLOAD_DIR", "TRAIN_LINES", "MIN_LEN", "MAX_LEN", "LEN_RATIO",
    "BPE_OPS", "SPM_VOCAB", "SPM_MODEL_TYPE", "SPM_SAMPLE", "WORKERS", "MODEL", "ARCH",
    "MAX_UPDATE", "WARMUP_UPDATES", "LABEL_SMOOTHING", "MAX_TOKENS", "TOKENS_PER_STEP",
    "UPDATE_FREQ", "DEVICE", "NUM_GPUS", "PRECISION", "SAVE_INTERVAL_UPDATES", "AVERAGE_LAST",
    "SEED", "LOG_INTERVAL", "TRAIN_TASK", "EXTRA_ARGS", "TASK", "BEAM", "LENPEN", "CHECKPOINT",
    "GEN_MAX_TOKENS", "GEN_ARGS", "AVERAGE_COMMAND", "SCORE_COMMAND", "PAIR", "STEP_NAME",
    "FR_VALID_LINES", "FR_TEST_LINES", "SHARED_DATA", "VENV", "DATA_BIN", "RUN_DIR",
    "MAX_LEN_A", "MAX_LEN_B", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "START_OVER",
}

TINY_MODEL_ARGS = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 4 "
    "--decoder-attention-heads 4 --max-valid-steps 2"
)




def generation_task() -> str:
    """The paper's generation task when the plugin registers it, else fairseq's own."""
    from fairseq.tasks import TASK_REGISTRY

    return "vaswani_translation" if "vaswani_translation" in TASK_REGISTRY else "translation"


def recipe_env(**overrides: str) -> dict:
    """The environment for a recipe: this interpreter's bin directory first on PATH, float32
    (the same tiny-model runs on every CPU, with or without bf16 instructions)."""
    env = {key: value for key, value in os.environ.items() if key not in RECIPE_VARIABLES}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PRECISION"] = "fp32"
    env.update({key: str(value) for key, value in overrides.items()})
    return env


def run_script(script: Path, env: dict, *args: str, check: bool = True,
               timeout: int = 600) -> subprocess.CompletedProcess:
    result = forked_cli.run(["bash", str(script), *args], env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{script.name} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def step_script(step: str) -> Path:
    """The script of one recipe step; it takes the language pair as its argument."""
    return RECIPES / "steps" / f"{step}.sh"


def run_with_common(script: str, **env: str) -> subprocess.CompletedProcess:
    """Run a bash script that sources ``recipes/common.sh`` (as ``$COMMON``)."""
    return forked_cli.run(["bash", "-c", script], capture_output=True, text=True, check=False,
                          env=recipe_env(COMMON=RECIPES / "common.sh", **env))


def run_prepare_text(*args) -> subprocess.CompletedProcess:
    return forked_cli.run([*command("prepare_text"), *map(str, args)],
                          capture_output=True, text=True, check=False)


def output_mtimes(step_dir: Path) -> dict:
    """mtime of every output listed in a step's marker, and of the marker itself."""
    marker = step_dir / ".done"
    names = [line.split(" ", 2)[2] for line in marker.read_text().splitlines()
             if line.startswith("output ")]
    assert names, f"{marker} lists no outputs"
    return {name: (step_dir / name).stat().st_mtime_ns for name in [*names, ".done"]}


# ---------------------------------------------------------------------------------------------
# vaswani-prepare-text


def test_cleaning_keeps_1_to_250_tokens_and_ratio_1_5():
    keep = prepare_text.keep_pair
    assert keep("a b c", "x y z", 1, 250, 1.5)
    assert keep("a b", "x y z", 1, 250, 1.5)          # 3 / 2 = 1.5 is allowed
    assert not keep("a b", "x y z w", 1, 250, 1.5)    # 4 / 2 = 2 is not
    assert not keep("a b c d", "x", 1, 250, 1.5)
    assert not keep("", "x", 1, 250, 1.5)             # an empty side
    long = " ".join(["w"] * 251)
    assert not keep(long, long, 1, 250, 1.5)
    assert keep(long[:-2], long[:-2], 1, 250, 1.5)    # exactly 250 tokens


def test_hypotheses_come_back_in_source_order_and_gaps_are_errors():
    lines = ["S-1\tsource", "H-1\t-0.5\tzweite", "D-1\t-0.5\tzweite", "P-1\t-0.1 -0.2",
             "H-2\t-0.7\t", "H-0\t-0.3\terste Zeile"]
    assert prepare_text.parse_hypotheses(lines, 3) == ["erste Zeile", "zweite", ""]
    with pytest.raises(prepare_text.UserError, match="1 of 4 sentences have no hypothesis"):
        prepare_text.parse_hypotheses(lines, 4)


def test_a_generate_log_holding_two_runs_is_refused(tmp_path, capsys):
    """Two runs appended (or a full run then a killed half run) mixed their hypotheses: the
    first H- line of each id was taken, from either run, without a word."""
    run = ["S-0\tA dog .", "H-0\t-0.3\tein Hund", "S-1\tA cat .", "H-1\t-0.2\teine Katze"]
    half = ["S-1\tA cat .", "H-1\t-0.9\tKatze Katze"]
    for log in (run + run, run + half, half + run):
        with pytest.raises(prepare_text.UserError, match="more than one run of fairseq-generate"):
            prepare_text.parse_hypotheses(log, 2)
    path = tmp_path / "generate-test.txt"
    path.write_text("\n".join(run + half) + "\n", encoding="utf-8")
    status = run_main(prepare_text.main, [
        "extract-hypotheses", "--expected", "2", str(path), str(tmp_path / "hyp.de")],
        prepare_text.PROG)
    assert status == 1 and not (tmp_path / "hyp.de").exists()
    assert "sentence 1 is translated again" in capsys.readouterr().err
    assert prepare_text.parse_hypotheses(run, 2) == ["ein Hund", "eine Katze"]


def test_sgm_segments_are_trimmed_and_whitespace_collapsed():
    sgm = ['<srcset setid="newstest2014" srclang="any">', '<doc docid="1" origlang="en">',
           '<seg id="1"> Hello\u00a0 world </seg>', '<seg id="2">a\tb</seg>', "</doc>"]
    assert list(prepare_text.sgm_segments(sgm)) == ["Hello world", "a b"]


def test_tokenisation_keeps_lines_aligned_and_round_trips():
    raw = ["Das ist „gut“, oder?", "", "E-Mail-Adresse: 3,5 Mio."]
    tokens = list(prepare_text.normalize_lines(raw, "de", tokenize=True, workers=1))
    assert len(tokens) == 3 and tokens[1] == ""
    assert tokens[0] == 'Das ist " gut " , oder ?'
    assert "@-@" in tokens[2]                          # aggressive hyphen splitting
    back = list(prepare_text.detokenize_lines(tokens, "de"))
    assert back[0] == 'Das ist "gut", oder?'
    assert back[2] == "E-Mail-Adresse: 3,5 Mio."


def test_parallel_tokenisation_keeps_the_order():
    lines = [f"Satz {i}: „Hallo“, Welt!" if i % 7 else "" for i in range(9000)]
    serial = list(prepare_text.normalize_lines(lines, "de", tokenize=True, workers=1))
    parallel = list(prepare_text.normalize_lines(lines, "de", tokenize=True, workers=2))
    assert parallel == serial and len(serial) == 9000
    assert serial[1] == 'Satz 1 : " Hallo " , Welt !' and serial[7] == ""


def test_count_lines_counts_a_last_line_without_newline(tmp_path):
    (tmp_path / "a").write_text("x\ny")
    (tmp_path / "b").write_text("x\ny\n")
    (tmp_path / "c").write_text("")
    assert [prepare_text.count_lines(tmp_path / n) for n in "abc"] == [2, 2, 0]


def test_cli_errors_are_one_line_and_leave_no_output(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    result = run_prepare_text("check-lines", tmp_path / "a.en", tmp_path / "a.de")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "line counts differ" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_prepare_text("clean", "--src-in", tmp_path / "a.en", "--tgt-in",
                              tmp_path / "a.de", "--src-out", tmp_path / "o.en",
                              "--tgt-out", tmp_path / "o.de")
    assert result.returncode == 1 and "not aligned" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.de", "a.en"]


def test_cli_clean_writes_the_kept_pairs_aligned(tmp_path):
    (tmp_path / "in.en").write_text("a b\na b c d\n\nx y z\n")
    (tmp_path / "in.de").write_text("a b c\nq\nr\nx y z\n")
    result = run_prepare_text("clean", "--src-in", tmp_path / "in.en", "--tgt-in",
                              tmp_path / "in.de", "--src-out", tmp_path / "out.en",
                              "--tgt-out", tmp_path / "out.de")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.en").read_text() == "a b\nx y z\n"
    assert (tmp_path / "out.de").read_text() == "a b c\nx y z\n"
    assert "kept 2 of 4 pairs" in result.stderr


# ---------------------------------------------------------------------------------------------
# Step markers (recipes/common.sh)

MARKER_SCRIPT = r"""
set -euo pipefail
source "$COMMON"
up=$ROOT/up; down=$ROOT/down
step_restart "$up"; echo data > "$up/a.txt"
step_mark_done "$up" "cfg-up" -- a.txt
step_restart "$down"; echo result > "$down/b.txt"
step_mark_done "$down" "cfg-down" "$up" -- b.txt
check() {
  if step_is_done "$down" "$1" "$up" 2>/dev/null; then echo "$2 done"; else echo "$2 redo"; fi
}
check cfg-down fresh
check other-cfg settings-changed
echo changed > "$down/b.txt"; check cfg-down output-changed
echo result > "$down/b.txt"; check cfg-down output-restored
rm "$down/b.txt"; check cfg-down output-deleted
echo result > "$down/b.txt"
step_mark_done "$up" "cfg-up" -- a.txt; check cfg-down upstream-redone-same
echo other > "$up/a.txt"; step_mark_done "$up" "cfg-up" -- a.txt; check cfg-down upstream-redone
"""


def test_step_markers_skip_done_steps_and_redo_changed_ones(tmp_path):
    result = run_with_common(MARKER_SCRIPT, ROOT=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [
        "fresh done", "settings-changed redo", "output-changed redo", "output-restored done",
        "output-deleted redo", "upstream-redone-same done", "upstream-redone redo"]


HOLDER_SCRIPT = r"""
set -euo pipefail
source "$COMMON"
STEP_NAME=prepare
hold_step "$DIR"; hold_step "$DIR"
bash -c 'source "$COMMON"; STEP_NAME=inner; hold_step "$DIR"' && echo "the chain holds it again"
echo held > "$ROOT/held"
while [ ! -e "$ROOT/release" ]; do sleep 0.05; done
"""


def test_a_second_recipe_in_a_step_directory_is_refused_naming_the_first(tmp_path):
    """Two recipes started at once into one directory (two ``run_all.sh`` into one new
    WORK_DIR): the second is refused in one line naming the first and its step; a script of
    the first one's own chain may hold it again; the lock ends with its holder, even killed."""
    root = tmp_path / "wörk dir"
    root.mkdir()
    env = recipe_env(COMMON=RECIPES / "common.sh", ROOT=root, DIR=root / "prepared")
    first = subprocess.Popen(["bash", "-c", HOLDER_SCRIPT], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(600):
            if (root / "held").exists() or first.poll() is not None:
                break
            time.sleep(0.05)
        assert (root / "held").exists(), first.communicate()
        second = run_with_common('source "$COMMON"; STEP_NAME=binarize; hold_step "$DIR"',
                                 DIR=root / "prepared")
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 1 and len(lines) == 1, second.stderr
        assert re.fullmatch(
            rf"binarize: error: {re.escape(str(root / 'prepared'))} is in use by bash \(pid "
            rf"{first.pid}, started [-0-9: ]+\), at its prepare step: wait for it to end, or "
            r"work in another WORK_DIR \(RUN_DIR\)", lines[0]), lines[0]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        out, _ = first.communicate()
    assert out == "the chain holds it again\n"
    for _ in range(100):  # its last sleep may hold the inherited descriptor a moment longer
        third = run_with_common('source "$COMMON"; hold_step "$DIR"', DIR=root / "prepared")
        if third.returncode == 0:
            break
        time.sleep(0.05)
    assert third.returncode == 0, third.stderr
    assert sorted(p.name for p in root.iterdir()) == [".prepared.lock", "held"]


def test_bad_settings_fail_with_one_line_before_any_work(tmp_path):
    env = recipe_env(WORK_DIR=tmp_path / "w", DEVICE="cpu", PRECISION="fp8")
    result = run_script(step_script("train"), env, "wmt14_en_de", check=False)
    assert result.returncode == 1
    assert "PRECISION must be fp16, bf16 or fp32, got 'fp8'" in result.stderr
    assert "Traceback" not in result.stderr
    env = recipe_env(WORK_DIR=tmp_path / "w", RAW_DIR=tmp_path)
    result = run_script(step_script("prepare"), env, "wmt14_en_de", check=False)
    assert result.returncode == 1 and "train.en is missing" in result.stderr
    assert not (tmp_path / "w" / "prepared" / ".done").exists()
    result = run_script(RECIPES / "make_offline_mirror.sh", recipe_env(), "en-xx", check=False)
    assert result.returncode == 1 and "usage" in result.stderr


MOVED_MARKER_SCRIPT = r"""
set -euo pipefail
source "$COMMON"
up=$ROOT/a/up; down=$ROOT/a/down
step_restart "$up"; echo data > "$up/a.txt"
step_mark_done "$up" "cfg-up" -- a.txt
step_restart "$down"; echo result > "$down/b.txt"
step_mark_done "$down" "cfg-down" "$up" -- b.txt
mv "$ROOT/a" "$ROOT/b"; up=$ROOT/b/up; down=$ROOT/b/down
if step_is_done "$down" cfg-down "$up" 2>/dev/null; then echo "moved done"
else echo "moved redo"; fi
work=$ROOT/work
step_begin "$work" cfg-work "$up"
check() {
  if step_can_continue "$work" "$1" "$up" 2>/dev/null; then echo "$2 continue"
  else echo "$2 restart"; fi
}
check cfg-work same
check other-cfg settings-changed
step_mark_done "$up" "cfg-up" -- a.txt; check cfg-work upstream-redone-same
echo other > "$up/a.txt"; step_mark_done "$up" "cfg-up" -- a.txt; check cfg-work upstream-redone
echo x > "$work/out"; step_mark_done "$work" cfg-work -- out
[ -f "$work/.started" ] && echo "started kept" || echo "started removed"
"""


def test_step_markers_follow_a_moved_directory_and_record_started_work(tmp_path):
    result = run_with_common(MOVED_MARKER_SCRIPT, ROOT=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [
        "moved done", "same continue", "settings-changed restart",
        "upstream-redone-same continue", "upstream-redone restart", "started removed"]


def test_every_entry_point_takes_a_known_pair_and_names_them_otherwise(tmp_path):
    env = recipe_env(WORK_DIR=tmp_path / "w")
    scripts = [step_script(step) for step in STEPS] + [RUN_ALL, RECIPES / "ablation.sh"]
    for script in scripts:
        for args in [("wmt14_en_xx",), ()]:
            result = run_script(script, env, *args, check=False)
            assert result.returncode == 1, (script, args)
            assert result.stderr.count("\n") == 1, result.stderr
            assert "wmt14_en_de wmt14_en_fr" in result.stderr, result.stderr
            assert ("unknown language pair 'wmt14_en_xx'" in result.stderr) == bool(args)
    assert not (tmp_path / "w").exists()
    assert sorted(p.stem for p in (RECIPES / "pairs").glob("*.sh")) == [
        "wmt14_en_de", "wmt14_en_fr"]


PAPER_SETTINGS_SCRIPT = r"""
set -euo pipefail
source "$COMMON"
activate_venv
load_pair wmt14_en_de
MODEL=base; model_defaults; echo "$MAX_UPDATE $AVERAGE_LAST $SAVE_INTERVAL_UPDATES"
unset ARCH MAX_UPDATE AVERAGE_LAST SAVE_INTERVAL_UPDATES
MODEL=big; model_defaults; echo "$MAX_UPDATE $AVERAGE_LAST $SAVE_INTERVAL_UPDATES $ARCH"
decoding_defaults; echo "$BEAM $LENPEN $MAX_LEN_B $SUBWORD_POST_PROCESS"
echo "$PAPER_TOKENS_PER_STEP $PAPER_WARMUP_STEPS $PAPER_LABEL_SMOOTHING $PAPER_ADAM_BETAS"
"""


def test_recipes_take_the_paper_settings_from_user_plugin_paper():
    from user_plugin import paper

    result = run_with_common(PAPER_SETTINGS_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [
        f"{paper.BASE_TRAIN_STEPS} {paper.BASE_AVERAGE_LAST} {paper.BASE_SAVE_INTERVAL}",
        f"{paper.BIG_TRAIN_STEPS} {paper.BIG_AVERAGE_LAST} {paper.BIG_SAVE_INTERVAL} vaswani_big",
        f"{paper.BEAM} {paper.LENPEN} {paper.MAX_LEN_OVER_SOURCE} subword_nmt",
        f"{paper.TOKENS_PER_STEP} {paper.WARMUP_STEPS} {paper.LABEL_SMOOTHING} "
        f"({paper.ADAM_BETAS[0]},{paper.ADAM_BETAS[1]})",
    ]


def sgm_text(lines: list) -> str:
    """A WMT-style SGM document with one <seg> per line."""
    body = "".join(f'<seg id="{i + 1}">{line}</seg>\n' for i, line in enumerate(lines))
    return f'<srcset setid="x" srclang="any">\n<doc docid="d" origlang="en">\n{body}</doc>\n'


def add_member(archive, name: str, text: str) -> None:
    import io
    import tarfile

    data = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def test_prepare_reads_the_wmt14_archives(tmp_path):
    """The download branch, offline: archives laid out as statmt.org ships them (already in
    DOWNLOAD_DIR, so nothing is fetched) are unpacked, the SGM sets extracted and checked."""
    import tarfile

    require_data(SHARED_DATA / "newstest2014-en-de")
    require_data(SHARED_DATA / "newstest2013-en-de")
    require_data(SHARED_DATA / "multi30k-en-de")
    text = {
        (split, lang): (SHARED_DATA / folder / f"{name}.{lang}").read_text(
            encoding="utf-8").splitlines()
        for split, folder, name in [("train", "multi30k-en-de", "train"),
                                    ("valid", "newstest2013-en-de", "newstest2013"),
                                    ("test", "newstest2014-en-de", "newstest2014")]
        for lang in ("en", "de")}
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    corpora = [("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en"),
               ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
               ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en")]
    for index, (archive_name, member) in enumerate(corpora):
        with tarfile.open(downloads / archive_name, "w:gz") as archive:
            for lang in ("en", "de"):
                part = text["train", lang][100 * index:100 * (index + 1)]
                add_member(archive, f"{member}.{lang}", "\n".join(part) + "\n")
    with tarfile.open(downloads / "wmt13-test.tgz", "w:gz") as archive:
        for lang in ("en", "de"):
            add_member(archive, f"test/newstest2013-src.{lang}.sgm",
                       sgm_text(text["valid", lang]))
    with tarfile.open(downloads / "wmt14-test-full.tgz", "w:gz") as archive:
        add_member(archive, "test-full/newstest2014-deen-src.en.sgm",
                   sgm_text(text["test", "en"]))
        add_member(archive, "test-full/newstest2014-deen-ref.de.sgm",
                   sgm_text(text["test", "de"]))

    work = tmp_path / "work"
    env = recipe_env(WORK_DIR=work, DOWNLOAD_DIR=downloads, BPE_OPS=200)
    result = run_script(step_script("prepare"), env, "wmt14_en_de")
    assert result.stderr.count("already downloaded") == 5
    assert "training/news-commentary-v9.de-en.en + training/news-commentary-v9.de-en.de: " \
           "100 pairs" in result.stderr
    prepared = work / "prepared"
    assert (prepared / "test.ref.de").read_text(encoding="utf-8").splitlines() == \
        [prepare_text.single_line(line) for line in text["test", "de"]]
    assert prepare_text.count_lines(prepared / "valid.de") == 3000
    assert prepare_text.count_lines(prepared / "train.en") == \
        prepare_text.count_lines(prepared / "train.de") <= 300

    (downloads / "wmt14-test-full.tgz").unlink()     # a test set that cannot be read
    with tarfile.open(downloads / "wmt14-test-full.tgz", "w:gz") as archive:
        add_member(archive, "test-full/newstest2014-deen-src.en.sgm",
                   sgm_text(text["test", "en"][:-1]))
        add_member(archive, "test-full/newstest2014-deen-ref.de.sgm",
                   sgm_text(text["test", "de"][:-1]))
    result = run_script(step_script("prepare"), {**env, "BPE_OPS": "201"}, "wmt14_en_de",
                        check=False)
    assert result.returncode == 1 and "3002 lines, expected 3003" in result.stderr
    assert not (prepared / ".done").exists()


# ---------------------------------------------------------------------------------------------
# The chains, offline


def make_mirror(pair: str, raw_dir: Path) -> None:
    run_script(RECIPES / "make_offline_mirror.sh",
               recipe_env(RAW_DIR=raw_dir, SHARED_DATA=SHARED_DATA), pair)


@pytest.fixture(scope="module")
def en_de_chain(tmp_path_factory):
    """EN-DE (BPE) through the mirror: 2000 Multi30k training pairs, a tiny model, 120 updates,
    then all 3003 newstest2014 sentences translated and scored."""
    for name in ("multi30k-en-de", "newstest2013-en-de", "newstest2014-en-de"):
        require_data(SHARED_DATA / name)
    root = tmp_path_factory.mktemp("wmt14_en_de")
    make_mirror("en-de", root / "raw")
    env = recipe_env(
        RAW_DIR=root / "raw", WORK_DIR=root / "work", TRAIN_LINES=2000, BPE_OPS=500,
        DEVICE="cpu", MAX_UPDATE=120, WARMUP_UPDATES=40, MAX_TOKENS=2048,
        TOKENS_PER_STEP=2048, SAVE_INTERVAL_UPDATES=30, AVERAGE_LAST=3, LOG_INTERVAL=20,
        EXTRA_ARGS=TINY_MODEL_ARGS, TASK=generation_task(), GEN_MAX_TOKENS=12000)
    result = run_script(RUN_ALL, env, "wmt14_en_de", timeout=900)
    return root / "work", env, result


def test_en_de_chain_scores_all_3003_sentences_with_both_bleus(en_de_chain):
    work, _, result = en_de_chain
    prepared = work / "prepared"
    assert (prepared / "bpe.codes").read_text().count("\n") >= 500  # header + 500 merges
    assert "@@ " in (prepared / "train.en").read_text()
    for step in ("prepared", "data-bin", "base/checkpoints", "base/average", "base/generate",
                 "base/score", "base/model"):
        assert (work / step / ".done").is_file(), step
    hyp = (work / "base/generate/hyp.detok.de").read_text(encoding="utf-8")
    assert hyp.count("\n") == 3003 and "@@" not in hyp
    scores = json.loads((work / "base/score/bleu.json").read_text())
    assert scores["num_sentences"] == 3003
    assert scores["tokenized_bleu"]["compound_split"] is True
    for key in ("tokenized_bleu", "sacrebleu"):
        assert 0.0 <= scores[key]["score"] <= 100.0
    assert scores["sacrebleu"]["signature"].startswith("nrefs:1")
    printed = (work / "base/score/bleu.txt").read_text()
    assert "tokenized BLEU" in printed and "sacreBLEU" in printed
    assert "update-freq = ceil(2048 / (2048 tokens x 1 cpu worker(s))) = 1" in result.stderr


def test_the_chain_leaves_a_package_with_its_scores_that_translates_alone(en_de_chain):
    """The package step: every command takes $RUN_DIR/model with no other option, with the
    outputs of the averaged checkpoint given with its data directory."""
    work, _, _ = en_de_chain
    package = work / "base/model"
    manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    scores = json.loads((work / "base/score/bleu.json").read_text(encoding="utf-8"))
    assert manifest["scores"]["sacrebleu"] == {
        "score": scores["sacrebleu"]["score"], "signature": scores["sacrebleu"]["signature"]}
    assert manifest["scores"]["test_set"] == "newstest2014"
    assert manifest["scores"]["tokenized_bleu"]["compound_split"] is True
    assert len(manifest["origin"]["checkpoints"][0]["averaged_from"]) == 3
    assert f"sacreBLEU {scores['sacrebleu']['score']:.1f}" in (package / "README.md").read_text(
        encoding="utf-8")
    raw = "A man rides a bike.\nTwo well-known dogs play in the snow.\n"
    outputs = [forked_cli.run([*command("translate"), *map(str, args)], input=raw, text=True,
                              capture_output=True, env=fairseq_env(), timeout=600, check=False)
               for args in ([package], [work / "base/average/checkpoint_avg.pt", "--data-dir",
                                        work / "data-bin"])]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr
    assert outputs[0].stdout == outputs[1].stdout and "@@" not in outputs[0].stdout


def test_en_de_average_loads_as_a_model(en_de_chain):
    from fairseq import checkpoint_utils

    work, _, _ = en_de_chain
    models, cfg = checkpoint_utils.load_model_ensemble(
        [str(work / "base/average/checkpoint_avg.pt")],
        arg_overrides={"data": str(work / "data-bin")})
    assert type(models[0]).__name__ == "VaswaniTransformerModel"
    assert cfg.model.encoder_embed_dim == 32
    log = (work / "base/average/.done").read_text()
    assert "upstream " + str(work / "base/checkpoints") in log


def test_rerun_skips_finished_steps_and_redoes_a_partly_deleted_one(en_de_chain):
    work, env, _ = en_de_chain
    dirs = [work / d for d in ("prepared", "data-bin", "base/checkpoints", "base/average",
                               "base/generate", "base/score", "base/model")]
    before = {d: output_mtimes(d) for d in dirs}
    result = run_script(RUN_ALL, env, "wmt14_en_de")
    assert result.stderr.count("skipping") == len(STEPS)
    assert {d: output_mtimes(d) for d in dirs} == before
    assert "BLEU" in result.stdout                     # score.sh prints the saved result

    binarized = work / "data-bin"
    old_id = (binarized / ".done").read_text().split("\nid ")[1].split("\n")[0]
    (binarized / "test.en-de.de.bin").unlink()
    result = run_script(step_script("binarize"), env, "wmt14_en_de")
    assert "output " + str(binarized / "test.en-de.de.bin") + " is missing" in result.stderr
    assert (binarized / "test.en-de.de.bin").stat().st_size > 0
    # redone into the same bytes: the same identity, so the steps after it stay finished
    assert (binarized / ".done").read_text().split("\nid ")[1].split("\n")[0] == old_id
    assert output_mtimes(work / "prepared") == before[work / "prepared"]


def test_a_data_setting_change_never_throws_away_a_trained_run(en_de_chain):
    """A finished run rerun with another BPE_OPS redid the data and trained from scratch,
    deleting its checkpoints, with one progress line."""
    work, env, _ = en_de_chain
    checkpoints = work / "base/checkpoints"
    before = {work / d: output_mtimes(work / d) for d in ("prepared", "data-bin",
                                                          "base/checkpoints")}
    result = run_script(RUN_ALL, {**env, "BPE_OPS": "400"}, "wmt14_en_de", check=False)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "START_OVER=1" in errors[0] and str(checkpoints) in errors[0]
    assert {d: output_mtimes(d) for d in before} == before
    for name, value in (("BPE_OPS", "0"), ("MIN_LEN", "300")):
        result = run_script(step_script("prepare"), {**env, name: value}, "wmt14_en_de",
                            check=False)
        errors = [line for line in result.stderr.splitlines() if ": error: " in line]
        assert result.returncode == 1 and len(errors) == 1 and name in errors[0], result.stderr
    assert {d: output_mtimes(d) for d in before} == before


def test_cleaning_that_keeps_no_pair_is_one_line(tmp_path, capsys):
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("a b c\nd e\n", encoding="utf-8")
    status = run_main(prepare_text.main, [
        "clean", "--min-len", "5", "--max-len", "9", "--src-in", str(tmp_path / "train.en"),
        "--tgt-in", str(tmp_path / "train.de"), "--src-out", str(tmp_path / "out.en"),
        "--tgt-out", str(tmp_path / "out.de")], prepare_text.PROG)
    err = capsys.readouterr().err
    assert status == 1 and "none of the 2 pairs" in err and err.count("\n") == 1
    assert not (tmp_path / "out.en").exists() and not (tmp_path / "out.de").exists()


def test_en_fr_chain_with_sentencepiece(tmp_path):
    require_data(SHARED_DATA / "newstest2014-en-fr")
    make_mirror("en-fr", tmp_path / "raw")
    assert (tmp_path / "raw" / "train.fr").read_text(encoding="utf-8").count("\n") == 2003
    work = tmp_path / "work"
    env = recipe_env(
        RAW_DIR=tmp_path / "raw", WORK_DIR=work, SPM_VOCAB=1000, DEVICE="cpu",
        MAX_UPDATE=40, WARMUP_UPDATES=20, MAX_TOKENS=2048, TOKENS_PER_STEP=2048,
        SAVE_INTERVAL_UPDATES=20, AVERAGE_LAST=2, LOG_INTERVAL=10,
        EXTRA_ARGS=TINY_MODEL_ARGS, TASK=generation_task())
    run_script(RUN_ALL, env, "wmt14_en_fr", timeout=900)
    prepared = work / "prepared"
    assert (prepared / "spm.model").stat().st_size > 0
    assert "\u2581" in (prepared / "train.fr").read_text(encoding="utf-8")
    hyp = (work / "base/generate/hyp.detok.fr").read_text(encoding="utf-8")
    assert hyp.count("\n") == 500 and "\u2581" not in hyp
    scores = json.loads((work / "base/score/bleu.json").read_text())
    assert scores["num_sentences"] == 500
    assert scores["tokenized_bleu"]["compound_split"] is False
    assert "sacrebleu" in scores and "signature" in scores["sacrebleu"]
