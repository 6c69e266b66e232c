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

import forked_cli
import pytest
from conftest import MULTI30K, REPO, require_data

KIT = REPO / "scripts" / "gpu_check"


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, *map(str, argv)], capture_output=True, text=True,
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
                "--carry", tiny_carry, "--out", out, "--budget", "1500", "--variants", "all"],
               timeout=1800)
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
        ("equivalence", "training", "decoding", "speed", "demo"), "passed"
    ), dry_run["proc"].stdout[-3000:]
    assert dry_run["proc"].returncode == 0
    assert dry_run["report"]["environment"]["device"] == "cpu"
    assert dry_run["report"]["environment"]["torch"]
    with tarfile.open(dry_run["out"] / "logs.tar.gz") as archive:
        names = archive.getnames()
    assert "logs/train-bf16-resume.log" in names and "logs/demo-generate.log" in names
    assert "logs/speed-tiny-ours-bf16.profile.txt" in names


def test_equivalence_figures_within_the_stated_tolerances(dry_run):
    section = dry_run["report"]["sections"]["equivalence"]
    for precision, figures in section["results"].items():
        tolerance = section["tolerances"][precision]
        assert figures["forward_logprob"] <= tolerance["logprob"], precision
        assert figures["incremental_logprob"] <= tolerance["logprob"], precision
    assert section["results"]["fp32"]["beam_identical"] == 1.0
    assert section["results"]["fp32"]["criterion_grad"] <= 1e-3
    masters = section["master_weights"]
    assert masters["passed"] and all(masters["checks"].values())
    assert masters["fp16_against_fairseq"]["overflows"] > 0


def test_training_falls_resumes_and_decodes_in_each_precision(dry_run):
    runs = dry_run["report"]["sections"]["training"]["runs"]
    assert set(runs) == {"fp32", "fp16", "memory_efficient_fp16", "bf16", "bf16_autocast"}
    for precision, figures in runs.items():  # --fp16 too: the plugin's runs on a CPU as well
        assert figures["last_loss"] < figures["first_loss"] - 0.5, precision
        assert figures["resumed_at_update"] == figures["updates"][0], precision
        assert figures["generate_sentences"] == 30, precision
    assert runs["memory_efficient_fp16"]["min_loss_scale"] > 0
    assert runs["fp16"]["min_loss_scale"] > 0


def test_decoding_against_stock_fairseq_gives_identical_hypotheses(dry_run):
    section = dry_run["report"]["sections"]["decoding"]
    assert section["sentences"] == 30 and section["identical_hypotheses"] == 30
    assert section["model"] == "train/fp32/checkpoint_last.pt" and section["output_tokens"] > 0
    assert "without --user-dir" in section["stock_process"]
    assert section["sentences_per_s"]["ours"] > 0 and section["sentences_per_s"]["stock"] > 0


def test_speed_runs_stock_without_the_plugin_and_counts_flops_by_the_formula(dry_run):
    section = dry_run["report"]["sections"]["speed"]
    corpus = section["corpus"]
    runs = section["runs"]
    assert set(runs) == {f"speed-tiny-{v}" for v in (
        "stock-fp16", "ours-bf16", "ours-fp16", "ours-bf16-compile", "ours-bf16-autocast")}
    assert all(r["status"] == "passed" for r in runs.values()), runs
    with tarfile.open(dry_run["out"] / "logs.tar.gz") as archive:
        stock = archive.extractfile("logs/speed-tiny-stock-fp16.log").read().decode()
        ours = archive.extractfile("logs/speed-tiny-ours-bf16.log").read().decode()
        compiled = archive.extractfile("logs/speed-tiny-ours-bf16-compile.log").read().decode()
    assert "--user-dir" not in stock.splitlines()[0] and "user_plugin.fairseq_patches" not in stock
    assert "--user-dir" in ours.splitlines()[0] and "--optimizer vaswani_adam" in ours
    assert "bf16_masters" in ours and "--compile-layers" in compiled.splitlines()[0]
    assert runs["speed-tiny-stock-fp16"]["plugin_loaded"] is False
    assert runs["speed-tiny-ours-bf16"]["plugin_loaded"] is True
    # the corpus has WMT14's lengths (newstest2014, BPE-scaled: about 26 target tokens)
    assert 20 < corpus["target_mean"] < 32 and corpus["vocabulary"] == 800
    # the tiny model: 1 layer per stack, d 32, d_ff 64; the one formula, written out here
    d, f, n, v = 32, 64, 1, corpus["vocabulary"]
    forward = (n * (8 * d * d + 4 * d * f) * corpus["source_tokens"]
               + n * 4 * d * corpus["source_squares"]
               + n * (12 * d * d + 4 * d * f) * corpus["target_tokens"]
               + n * 4 * d * corpus["target_squares"] + n * 4 * d * corpus["source_target"]
               + n * 4 * d * d * corpus["source_tokens"] + 2 * d * v * corpus["target_tokens"])
    for name, figures in runs.items():
        assert figures["flops_per_target_token"] == pytest.approx(
            3 * forward / corpus["target_tokens"], rel=1e-9)
        assert figures["target_tokens_per_s"] > 0 and figures["peak_memory_gib"] > 0
        assert figures["intervals"] == 2 and figures["updates_measured"] == 4, name
        assert figures["mfu"] is None  # no MFU on a CPU: no peak to compare with
        assert figures["paper_base_schedule_hours"] > 0
        profile = figures["profile"]
        assert profile["calls"] == [7, 9] and profile["wall_ms_per_update"] > 0
        # on a CPU our bf16 / fp16 training writes attention out (the fused CPU kernel's
        # backward is slow there: modules/scaled_dot_product.fused_is_slow); stock's is fused
        fused_calls = sum(profile["attention_backends_per_update"].values())
        assert (fused_calls > 0) == (name == "speed-tiny-stock-fp16"), name
        shares = profile["host_operator_shares"]
        parts = ("matrix_products", "attention_kernels", "python_between_operators",
                 "other_operators")
        assert sum(shares[part] for part in parts) == pytest.approx(1.0), name
        assert shares["matrix_products"] > 0 and shares["python_between_operators"] > 0, name
        assert (shares["attention_kernels"] > 0) == (fused_calls > 0), name
        assert 0 < sum(shares["largest_other_operators"].values()) <= shares["other_operators"]
        assert "sync_debug" not in figures  # CUDA only
    assert runs["speed-tiny-ours-bf16"]["profile"]["attention_forward_order"] == []
    assert section["ratio_tiny_ours_bf16_over_stock_fp16"] == pytest.approx(
        runs["speed-tiny-ours-bf16"]["target_tokens_per_s"]
        / runs["speed-tiny-stock-fp16"]["target_tokens_per_s"])
    assert "training FLOPs = 3 x forward" in section["flops_formula"]


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
    proc = run([KIT / "run_check.py", "--carry", tiny_carry, "--out", tmp_path,
                "--variants", "ours-fp8"], timeout=60)
    assert proc.returncode == 2
    assert "unknown variant(s) ['ours-fp8']" in proc.stderr.strip().splitlines()[-1]


def test_keep_report_files_a_gpu_report_once_and_refuses_the_dry_run(dry_run, tmp_path):
    keep = [KIT / "keep_report.py", "--runs-dir", tmp_path / "runs"]
    dry = dry_run["out"] / "gpu_report.json"
    proc = run([*keep, dry], timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "keep_report: error: the report is the CPU dry run's, not a GPU run's"]
    report = json.loads(dry.read_text())
    report["tiny"] = False
    report["environment"].update(device="NVIDIA H100 80GB HBM3", cuda="13.0")
    gpu = tmp_path / "gpu_report.json"
    gpu.write_text(json.dumps(report))
    first = run([*keep, gpu], timeout=60)
    assert first.returncode == 0, first.stderr
    kept = Path(first.stdout.strip())
    assert kept.parent == tmp_path / "runs" and kept.read_text() == gpu.read_text()
    assert kept.name.endswith("-nvidia-h100-80gb-hbm3-equivalence-training-decoding-speed-demo"
                              ".json") and kept.name[:4].isdigit()
    again = run([*keep, gpu], timeout=60)  # the same report: nothing changes
    assert again.returncode == 0 and again.stdout == first.stdout
    report["finished"] = "later"
    gpu.write_text(json.dumps(report))
    clash = run([*keep, gpu], timeout=60)
    assert clash.returncode == 1 and "exists with another report" in clash.stderr
    assert json.loads(kept.read_text()).get("finished") != "later"
    del report["environment"]["cuda"]
    gpu.write_text(json.dumps(report))
    assert "names no cuda" in run([*keep, gpu], timeout=60).stderr
