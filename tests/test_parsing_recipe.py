"""The parsing recipe (recipes/ptb_parsing/, paper §6.3) end to end on a tiny synthetic
treebank with a tiny model, through the demo's one command: it trains the parsing
architecture, decodes with beam 21, alpha 0.3 and input + 300 (the values of user_plugin/paper.py
as fairseq-generate received them), turns the outputs into trees over the test words and prints
EVALB's F1; run again, every step is skipped. A bad PTB_DIR is one error line before training."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked_cli
import pytest
from conftest import REPO
from fairseq.data import Dictionary

from user_plugin import paper
from user_plugin.parsing.trees import parse_tree, words_of

RECIPE = REPO / "recipes" / "ptb_parsing"
STEPS = ("prepare", "binarize", "train", "generate", "score")
# Settings the recipe reads: a value in the caller's environment must not leak into a test.
RECIPE_VARIABLES = {
    "WORK_DIR", "PTB_DIR", "POS_TAGS", "SRC_VOCAB", "WORKERS", "ARCH", "DROPOUT", "LR_SCALE",
    "WARMUP_UPDATES", "LABEL_SMOOTHING", "MAX_UPDATE", "MAX_TOKENS", "TOKENS_PER_STEP",
    "UPDATE_FREQ", "DEVICE", "NUM_GPUS", "PRECISION", "SEED", "LOG_INTERVAL", "EXTRA_ARGS",
    "GEN_SUBSET", "CHECKPOINT", "BEAM", "LENPEN", "MAX_LEN_OVER_SOURCE", "GEN_MAX_TOKENS",
    "GEN_ARGS", "SETUP_VENV", "SYNTH_TRAIN", "SYNTH_DEV", "SYNTH_TEST", "SYNTH_SEED",
    "DEMO_MODEL_ARGS", "STEP_NAME", "VENV", "START_OVER",
}
TINY_MODEL_ARGS = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
    "--decoder-attention-heads 2"
)
TEST_TREES = 16


def recipe_env(**overrides) -> dict:
    """The environment for a recipe: this interpreter's bin directory first on PATH."""
    env = {key: value for key, value in os.environ.items() if key not in RECIPE_VARIABLES}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env["PRECISION"] = "fp32"  # the same tiny-model runs on CPUs with and without bf16
    env.update({key: str(value) for key, value in overrides.items()})
    return env


def run_recipe(script: str, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return forked_cli.run(["bash", str(RECIPE / script)], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """demo.sh with 150 training trees, a 1-layer model of width 32 and 20 updates."""
    work = tmp_path_factory.mktemp("parsing") / "work"
    env = recipe_env(
        WORK_DIR=work, SETUP_VENV=0, SYNTH_TRAIN=150, SYNTH_DEV=16, SYNTH_TEST=TEST_TREES,
        MAX_UPDATE=20, WARMUP_UPDATES=10, MAX_TOKENS=1024, LOG_INTERVAL=10,
        DEMO_MODEL_ARGS=TINY_MODEL_ARGS)
    result = run_recipe("demo.sh", env)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return work, env, result


def printed_f1(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("F1 (test, all sentences):")]
    assert len(lines) == 1, stdout[-2000:]
    return lines[0].split()[4]


def test_demo_trains_the_parsing_architecture_with_separate_vocabularies(demo):
    work, _, result = demo
    for step in ("synthetic", "prepared", "data-bin", "checkpoints", "generate/test",
                 "score/test"):
        assert (work / step / ".done").is_file(), step
    assert "--arch vaswani_parsing_wsj --share-decoder-input-output-embed" in result.stderr
    assert "--share-all-embeddings" not in result.stderr
    words = Dictionary.load(str(work / "data-bin" / "dict.words.txt"))
    brackets = Dictionary.load(str(work / "data-bin" / "dict.brackets.txt"))
    # POS_TAGS=keep (the default): brackets and part-of-speech tags, no words, no XX
    assert {"(S", ")S", "(NP", ")NP", "DT", "NN", "."} <= set(brackets.symbols)
    assert "XX" not in brackets.symbols and "the" not in brackets.symbols
    assert "the" in words.symbols and "(S" not in words.symbols
    assert "num_updates 20" in result.stdout


def test_demo_decodes_with_the_papers_beam_penalty_and_length_limit(demo):
    work, _, result = demo
    settings = (f"--beam {paper.PARSING_BEAM} --lenpen {paper.PARSING_LENPEN} "
                f"--max-len-over-source {paper.PARSING_MAX_LEN_OVER_SOURCE}")
    assert settings == "--beam 21 --lenpen 0.3 --max-len-over-source 300"
    commands = [line for line in result.stderr.splitlines() if "+ fairseq-generate" in line]
    assert len(commands) == 1 and settings in commands[0]
    assert "--task vaswani_translation" in commands[0]
    for option in ("'beam': 21", "'lenpen': 0.3", "'max_len_over_source': 300",
                   "'length_penalty_form': 'gnmt'", "'stop_rule': 'no-better'"):
        assert option in result.stderr, option        # the configuration fairseq-generate logs
    generated = (work / "generate" / "test" / "generate.txt").read_text()
    assert "Generate test with beam=21" in generated
    sources = {line.split("\t")[0][2:]: line.split("\t")[1].split()
               for line in generated.splitlines() if line.startswith("S-")}
    hypotheses = {line.split("\t")[0][2:]: line.split("\t")[2].split()
                  for line in generated.splitlines() if line.startswith("H-")}
    assert len(hypotheses) == len(sources) == TEST_TREES
    for key, tokens in hypotheses.items():
        assert len(tokens) <= len(sources[key]) + paper.PARSING_MAX_LEN_OVER_SOURCE


def test_demo_turns_every_output_into_a_tree_over_the_test_words_and_prints_f1(demo):
    work, _, result = demo
    sentences = (work / "prepared" / "test.words").read_text().splitlines()
    trees = (work / "generate" / "test" / "parsed.trees").read_text().splitlines()
    assert len(trees) == len(sentences) == TEST_TREES
    for line, sentence in zip(trees, sentences):
        tree = parse_tree(line)
        assert tree.label() == "TOP" and words_of(tree) == sentence.split()
    repairs = json.loads((work / "generate" / "test" / "repairs.json").read_text())
    assert repairs["sentences"] == TEST_TREES
    scores = json.loads((work / "score" / "test" / "evalb.json").read_text())
    assert scores["all"]["sentences"] == TEST_TREES and scores["all"]["error_sentences"] == 0
    assert printed_f1(result.stdout) == f"{scores['all']['f1']:.2f}"
    assert "Bracketing FMeasure" in result.stdout
    assert f"bracket F1 {scores['all']['f1']:.2f}" in result.stderr     # the demo's last words
    assert "fallback trees:" in result.stdout


def test_rerunning_the_demo_skips_every_step(demo):
    work, env, first = demo
    result = run_recipe("demo.sh", env)
    assert result.returncode == 0, result.stderr[-3000:]
    for step in STEPS:
        assert re.search(rf"^\[[0-9:]+ {step}\] already done", result.stderr, re.M), step
    assert "+ fairseq-train" not in result.stderr
    assert printed_f1(result.stdout) == printed_f1(first.stdout)


def kill_training_at_its_first_checkpoint(env: dict, checkpoints: Path) -> None:
    """Start the train step and SIGKILL its process group once checkpoint_last.pt exists."""
    run = subprocess.Popen(["bash", str(RECIPE / "train.sh")], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while (not (checkpoints / "checkpoint_last.pt").exists() and run.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert run.poll() is None, "the run ended before it could be interrupted"
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    assert not (checkpoints / ".done").exists()


def test_interrupted_training_resumes_only_with_the_same_settings(demo, tmp_path):
    """A killed run resumes from its checkpoints; with other settings it is refused, and starts
    over when asked to (START_OVER=1) instead of loading a checkpoint of another model."""
    work, _, _ = demo
    env = recipe_env(WORK_DIR=tmp_path / "work", PTB_DIR=work / "synthetic", DEVICE="cpu",
                     MAX_UPDATE=300, WARMUP_UPDATES=2, MAX_TOKENS=256, TOKENS_PER_STEP=256,
                     LOG_INTERVAL=50,
                     EXTRA_ARGS=f"{TINY_MODEL_ARGS} --save-interval-updates 20")
    for step in ("prepare.sh", "binarize.sh"):
        assert run_recipe(step, env).returncode == 0, step
    checkpoints = tmp_path / "work" / "checkpoints"
    kill_training_at_its_first_checkpoint(env, checkpoints)
    result = run_recipe("train.sh", env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming in {checkpoints}" in result.stderr
    assert "starting over" not in result.stderr
    assert (checkpoints / ".done").is_file()
    shutil.rmtree(checkpoints)
    kill_training_at_its_first_checkpoint(env, checkpoints)
    refused = run_recipe("train.sh", {**env, "DROPOUT": "0.2"})  # it would delete checkpoints
    assert refused.returncode == 1 and "set START_OVER=1" in refused.stderr
    assert (checkpoints / "checkpoint_last.pt").is_file()
    result = run_recipe("train.sh", {**env, "DROPOUT": "0.2", "START_OVER": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cannot be continued" in result.stderr
    assert f"starting over in {checkpoints}" in result.stderr
    assert "resuming in" not in result.stderr
    assert (checkpoints / ".done").is_file()


def test_with_xx_targets_the_parsed_trees_take_the_gold_tags(tmp_path):
    """POS_TAGS=xx (Vinyals et al.): the model predicts no tags, the trees get the gold ones."""
    work = tmp_path / "work"
    env = recipe_env(
        WORK_DIR=work, SETUP_VENV=0, POS_TAGS="xx", SYNTH_TRAIN=60, SYNTH_DEV=8, SYNTH_TEST=8,
        MAX_UPDATE=4, WARMUP_UPDATES=2, MAX_TOKENS=1024, LOG_INTERVAL=2,
        DEMO_MODEL_ARGS=TINY_MODEL_ARGS, MAX_LEN_OVER_SOURCE=20)
    result = run_recipe("demo.sh", env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "XX" in Dictionary.load(str(work / "data-bin" / "dict.brackets.txt")).symbols
    assert "--tags-from" in result.stderr
    gold = (work / "prepared" / "test.gold").read_text().splitlines()
    parsed = (work / "generate" / "test" / "parsed.trees").read_text().splitlines()
    assert [parse_tree(line).pos() for line in parsed] == [parse_tree(line).pos() for line in gold]


# ---------------------------------------------------------------------------------------------
# A bad PTB_DIR

GOOD_TREE = "( (S (NP-SBJ (DT The) (NN dog)) (VP (VBD barked)) (. .)) )\n"


def ldc_layout(root: Path, sections, bad_file: str = "") -> Path:
    for section in sections:
        folder = root / "wsj" / f"{section:02d}"
        folder.mkdir(parents=True)
        (folder / f"wsj_{section:02d}01.mrg").write_text(GOOD_TREE)
    if bad_file:
        (root / "wsj" / "23" / "wsj_2302.mrg").write_text(bad_file)
    return root


@pytest.mark.parametrize("case, message", [
    ("unset", "PTB_DIR is not set"),
    ("nowhere", "no such directory"),
    ("missing-sections", "WSJ section(s) 05, 22 missing"),
    ("not-a-tree", "wsj_2302.mrg:2: not a bracketed tree"),
    ("binary", "wsj_2302.mrg: not a text file"),
    ("missing-dev", "dev.trees missing"),
    ("unbalanced-line", "test.trees:2: unbalanced brackets"),
])
def test_a_bad_ptb_dir_is_one_error_line_before_any_training(tmp_path, case, message):
    ptb = tmp_path / "ptb"
    if case == "missing-sections":
        ldc_layout(ptb, [s for s in range(2, 24) if s not in (5, 22)])
    elif case == "not-a-tree":
        ldc_layout(ptb, range(2, 24), bad_file=GOOD_TREE + "This file holds no trees.\n")
    elif case == "binary":
        ldc_layout(ptb, range(2, 24))
        (ptb / "wsj" / "23" / "wsj_2302.mrg").write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00")
    elif case in ("missing-dev", "unbalanced-line"):
        ptb.mkdir()
        for name in ("train", "dev", "test"):
            if case != "missing-dev" or name != "dev":
                (ptb / f"{name}.trees").write_text(GOOD_TREE)
        if case == "unbalanced-line":
            (ptb / "test.trees").write_text(GOOD_TREE + "(S (NP (NN dog)) (VP (VBD ran))\n")
    overrides = {} if case == "unset" else {"PTB_DIR": ptb}
    work = tmp_path / "work"
    result = run_recipe("run_all.sh", recipe_env(WORK_DIR=work, **overrides), timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "=== binarize ===" not in result.stderr
    assert not (work / "data-bin").exists() and not (work / "checkpoints").exists()
    assert not (work / "prepared" / ".done").exists()
