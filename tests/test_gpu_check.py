"""The GPU check's CPU dry run: the same kit (``scripts/gpu_check/``) with tiny sizes on this
machine, so that it cannot rot between the sessions that have a GPU machine.

One run of every section (about 3 minutes on 2 cores) feeds the assertions below; each checks a
figure the check computes, recomputed here where it is a formula.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import MULTI30K, REPO, require_data

KIT = REPO / "scripts" / "gpu_check"


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, env=dict(__import__("os").environ, OMP_NUM_THREADS="1"),
                          **kwargs)


@pytest.fixture(scope="module")
def tiny_carry(tmp_path_factory) -> Path:
    require_data(MULTI30K)
    carry = tmp_path_factory.mktemp("gpu check carry") / "carry"
    proc = run([KIT / "build_carry.py", "--tiny", "--carry", carry], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return carry


@pytest.fixture(scope="module")
def dry_run(tiny_carry, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu check out")
    proc = run([KIT / "run_check.py", "--device", "cpu", "--tiny", "--no-install",
                "--carry", tiny_carry, "--out", out, "--budget", "1200"], timeout=1500)
    report = json.loads((out / "gpu_report.json").read_text())
    return {"proc": proc, "report": report, "out": out}


def test_carry_is_verified_and_a_rerun_changes_nothing(tiny_carry):
    manifest = (tiny_carry / "manifest.json").read_bytes()
    proc = run([KIT / "build_carry.py", "--tiny", "--carry", tiny_carry], timeout=120)
    assert proc.returncode == 0 and "nothing to do" in proc.stdout
    assert (tiny_carry / "manifest.json").read_bytes() == manifest
    victim = tiny_carry / "data" / "multi30k" / "dict.en.txt"
    victim.write_text(victim.read_text() + "extra 1\n")
    check = run([KIT / "build_carry.py", "--check", "--carry", tiny_carry], timeout=60)
    assert check.returncode == 1
    assert "dict.en.txt: sha256 differs" in check.stderr and len(check.stderr.splitlines()) == 1
    victim.write_text("".join(victim.read_text().splitlines(keepends=True)[:-1]))
    assert run([KIT / "build_carry.py", "--check", "--carry", tiny_carry]).returncode == 0


def test_every_section_passes_on_cpu(dry_run):
    statuses = {name: s["status"] for name, s in dry_run["report"]["sections"].items()}
    assert statuses == dict.fromkeys(
        ("equivalence", "training", "decoding", "speed", "profile", "demo"), "passed"
    ), dry_run["proc"].stdout[-3000:]
    assert dry_run["proc"].returncode == 0
    assert dry_run["report"]["environment"]["device"] == "cpu"
    assert dry_run["report"]["environment"]["torch"]
    with tarfile.open(dry_run["out"] / "logs.tar.gz") as archive:
        names = archive.getnames()
    assert "logs/train-bf16-resume.log" in names and "logs/demo-generate.log" in names


def test_equivalence_figures_within_the_stated_tolerances(dry_run):
    section = dry_run["report"]["sections"]["equivalence"]
    for precision, figures in section["results"].items():
        tolerance = section["tolerances"][precision]
        assert figures["forward_logprob"] <= tolerance["logprob"], precision
        assert figures["incremental_logprob"] <= tolerance["logprob"], precision
    assert section["results"]["fp32"]["beam_identical"] == 1.0
    assert section["results"]["fp32"]["criterion_grad"] <= 1e-3


def test_training_falls_resumes_and_decodes_in_each_precision(dry_run):
    runs = dry_run["report"]["sections"]["training"]["runs"]
    assert runs["fp16"]["status"] == "skipped" and "CUDA" in runs["fp16"]["reason"]
    for precision in ("fp32", "memory_efficient_fp16", "bf16"):
        figures = runs[precision]
        assert figures["last_loss"] < figures["first_loss"] - 0.5, precision
        assert figures["resumed_at_update"] == figures["updates"][0], precision
        assert figures["generate_sentences"] == 30, precision
    assert runs["memory_efficient_fp16"]["min_loss_scale"] > 0


def test_decoding_against_stock_fairseq_gives_identical_hypotheses(dry_run):
    section = dry_run["report"]["sections"]["decoding"]
    assert section["sentences"] == 30 and section["identical_hypotheses"] == 30
    assert section["model"] == "train/fp32/checkpoint_last.pt" and section["output_tokens"] > 0
    assert "without --user-dir" in section["stock_process"]
    assert section["sentences_per_s"]["ours"] > 0 and section["sentences_per_s"]["stock"] > 0


def test_speed_runs_stock_without_the_plugin_and_counts_flops_by_the_formula(dry_run):
    section = dry_run["report"]["sections"]["speed"]
    stats = section["data"]
    runs = section["runs"]
    assert set(runs) == {"speed-tiny-stock-fp32", "speed-tiny-ours-fp32", "speed-tiny-ours-bf16",
                         "speed-tiny-ours-fp32-vaswani_adam", "speed-tiny-ours-bf16-vaswani_adam"}
    assert {runs[name]["optimizer"] for name in runs} == {"adam", "vaswani_adam"}
    log = dry_run["out"] / "logs.tar.gz"
    with tarfile.open(log) as archive:
        stock = archive.extractfile("logs/speed-tiny-stock-fp32.log").read().decode()
        ours = archive.extractfile("logs/speed-tiny-ours-fp32.log").read().decode()
    assert "--user-dir" not in stock.splitlines()[0] and "user_plugin" not in stock
    assert "--user-dir" in ours.splitlines()[0]
    # the tiny model: 1 layer per stack, d 32, d_ff 64
    d, f, n = 32, 64, 1
    ls, lt = stats["source_attention_length"], stats["target_attention_length"]
    per_source = n * (8 * d * d + 4 * d * f + 4 * d * ls) + n * 4 * d * d
    per_target = n * (12 * d * d + 4 * d * f + 4 * d * lt + 4 * d * ls) + 2 * d * stats[
        "vocabulary"]
    expected = 3 * (stats["source_per_target"] * per_source + per_target)
    for figures in runs.values():
        assert figures["flops_per_target_token"] == pytest.approx(expected, rel=1e-9)
        assert figures["target_tokens_per_s"] > 0 and figures["peak_memory_gib"] > 0
        assert figures["mfu"] is None  # no MFU on a CPU: no peak to compare with
    assert section["ratio_tiny_ours_fp32_over_stock_fp32"] == pytest.approx(
        runs["speed-tiny-ours-fp32"]["target_tokens_per_s"]
        / runs["speed-tiny-stock-fp32"]["target_tokens_per_s"])
    assert section["ratio_tiny_ours_bf16_vaswani_adam_over_stock_fp32"] == pytest.approx(
        runs["speed-tiny-ours-bf16-vaswani_adam"]["target_tokens_per_s"]
        / runs["speed-tiny-stock-fp32"]["target_tokens_per_s"])
    with tarfile.open(log) as archive:
        multi_tensor = archive.extractfile("logs/speed-tiny-ours-bf16-vaswani_adam.log")
        assert "--optimizer vaswani_adam" in multi_tensor.read().decode().splitlines()[0]


def test_profile_tables_name_the_training_step(dry_run):
    section = dry_run["report"]["sections"]["profile"]
    for impl in ("stock-fp32", "ours-fp32", "ours-bf16"):
        top = "\n".join(section[f"profile-tiny-{impl}"]["top"])
        assert f"train_step-{section['steps'][0]}" in top and "forward" in top, impl


def test_demo_trains_averages_and_scores(dry_run):
    section = dry_run["report"]["sections"]["demo"]
    assert section["test_sentences"] == 30
    assert section["sacrebleu"] is not None and section["sacrebleu"] >= 0
    assert section["wall_seconds"] >= section["train_seconds"] > 0


def test_a_section_without_its_input_is_skipped_and_the_report_still_written(tiny_carry,
                                                                            tmp_path):
    proc = run([KIT / "run_check.py", "--device", "cpu", "--tiny", "--no-install", "--carry",
                tiny_carry, "--out", tmp_path, "--sections", "decoding"], timeout=300)
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["sections"]["decoding"]["status"] == "skipped"
    assert "training section" in report["sections"]["decoding"]["reason"]
    assert "demo" in report["sections"]["decoding"]["reason"]
    assert proc.returncode == 0


def test_an_unknown_section_is_one_line(tiny_carry, tmp_path):
    proc = run([KIT / "run_check.py", "--carry", tiny_carry, "--out", tmp_path,
                "--sections", "speed,warp"], timeout=60)
    assert proc.returncode == 2
    assert "unknown section(s) ['warp']" in proc.stderr.strip().splitlines()[-1]
