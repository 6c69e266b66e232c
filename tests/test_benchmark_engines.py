"""scripts/benchmark_engines.py measures every engine on the same sentences and reports speed,
BLEU and agreement with the exact decoder. Wall time is printed, never asserted: this test runs
it on a small trained model and checks what makes its table meaningful."""

from __future__ import annotations

import json
import sys

import forked_cli
import pytest
from cli import REPO, fairseq_env

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (the test extra has it)")


def test_engines_decode_the_same_sentences_and_report_speed_bleu_agreement(shipping_models,
                                                                           tmp_path):
    out = tmp_path / "engines.json"
    markdown = tmp_path / "engines.md"
    command = [
        sys.executable, str(REPO / "scripts" / "benchmark_engines.py"),
        "--checkpoint", str(shipping_models.checkpoints["postnorm_shared"]),
        "--data-dir", str(shipping_models.data_bin),
        "--reference", str(shipping_models.text_dir / "test.de"),
        "--work-dir", str(tmp_path / "work"), "--threads", "1", "--repeats", "2",
        "--json-out", str(out), "--markdown-out", str(markdown),
    ]
    proc = forked_cli.run(command, env={**fairseq_env(), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert list(summary) == ["builtin", "ours", "ours-fairseq-rules", "ct2-float32", "ct2-int8"]
    assert result["machine"]["cpu"] and isinstance(result["machine"]["cpu_flags"], list)
    for engine, runs in result["runs"].items():
        assert [run["sentences"] for run in runs["1"]] == [100, 100], engine
        assert not {"hypotheses", "scores"} & set(runs["1"][0])  # per sentence: not kept
        assert all(run["tokens"] > 100 and run["seconds"] > 0 for run in runs["1"])
        assert summary[engine]["threads_1"]["sentences_per_s"] > 0
    assert summary["ours"]["agreement_with_exact"]["share"] == 1.0
    assert summary["builtin"]["threads_1"]["speedup_over_builtin"] == pytest.approx(1.0)
    assert summary["builtin"]["threads_1"]["speedup_by_repeat"] == pytest.approx([1.0, 1.0])
    ours_runs = result["runs"]["ours"]["1"]
    stock_runs = result["runs"]["builtin"]["1"]
    assert summary["ours"]["threads_1"]["speedup_by_repeat"] == pytest.approx(
        [mine["sentences_per_s"] / stock["sentences_per_s"]
         for mine, stock in zip(ours_runs, stock_runs)])
    # our model searched by stock's rules finds stock's hypotheses: its speed-up compares like
    # with like (one near-tie in 100 sentences may flip, the models agree to 1e-5)
    assert summary["ours-fairseq-rules"]["agreement_with_builtin"]["share"] >= 0.99
    assert summary["builtin"]["agreement_with_builtin"]["share"] == 1.0
    assert "agreement_with_builtin" not in summary["ours"]
    # CTranslate2 float32 re-ranked by the GNMT penalty is the exact decoder here, so it
    # scores the same BLEU; int8 and fairseq's own penalty may differ a little.
    float32 = summary["ct2-float32"]["agreement_with_exact"]
    assert float32["share"] >= 0.97 and float32["differ"] <= 3
    if float32["differ"] == 0:
        assert summary["ct2-float32"]["bleu"]["score"] == summary["ours"]["bleu"]["score"]
    assert summary["ct2-int8"]["agreement_with_exact"]["share"] > 0.5
    assert all(0 < entry["bleu"]["score"] <= 100 and "nrefs:1" in entry["bleu"]["signature"]
               for entry in summary.values())
    table = markdown.read_text()
    assert table.count("\n") == 2 + 5 and "| ct2-int8 |" in table
    assert "| 1.00x | 1.00-1.00 (1.00x) |" in table  # the built-in against itself
    assert proc.stdout.count("exporting") == 3
    # a second run reuses the exports
    again = forked_cli.run(command[:-4] + ["--repeats", "1", "--engines", "ct2-float32"],
                           env={**fairseq_env(), "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "exporting" not in again.stdout


def test_decoding_attribution_times_each_part_in_both_models(shipping_models, tmp_path):
    """scripts/decoding_attribution.py: the timers attach to both models' attention modules,
    their projections and the generator's reorders, and the parts add up."""
    export = tmp_path / "builtin.pt"
    exported = forked_cli.run(
        [sys.executable, "-m", "user_plugin.commands.export",
         str(shipping_models.checkpoints["postnorm_shared"]), "--data-dir",
         str(shipping_models.data_bin), "--to", "fairseq", "--output", str(export)],
        env={**fairseq_env(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600, check=False)
    assert exported.returncode == 0, exported.stderr[-2000:]
    out = tmp_path / "attribution.json"
    command = [sys.executable, str(REPO / "scripts" / "decoding_attribution.py"),
               "--checkpoint", str(shipping_models.checkpoints["postnorm_shared"]),
               "--builtin", str(export), "--data-dir", str(shipping_models.data_bin),
               "--repeats", "1", "--json-out", str(out)]
    proc = forked_cli.run(command, env={**fairseq_env(), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    for run in ("stock", "ours"):
        parts = summary[run]
        assert 0 < parts["projections"] < parts["attention"] < parts["generation"], run
        assert parts["reorders"] > 0, run
        assert parts["attention_owned"] + parts["rest"] == pytest.approx(parts["generation"])
    assert summary["speedup"] == pytest.approx(
        summary["stock"]["generation"] / summary["ours"]["generation"])
    assert "at most" in proc.stdout and "| stock |" in proc.stdout
    missing = forked_cli.run(command[:4] + ["--builtin", str(tmp_path / "none.pt"),
                                            "--data-dir", str(shipping_models.data_bin)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"decoding_attribution.py: error: {tmp_path / 'none.pt'}: no such model file"]
