"""``scripts/benchmark_host.py``, run tiny (1 layer per stack, three of its runs): operators and
host-device synchronisations per update of real ``fairseq-train`` processes
(``user_plugin/measurement/host_benchmark.py``, ``train_step_probe.py``).

* the JSON is a list of records with exactly the keys progress is read from;
* the stock process never loaded the plugin, ours did; ours' counts are whole numbers (each of
  its counted updates makes the same calls; stock fairseq's vary by a call or two with the
  batch, e.g. when its sinusoidal table grows);
* ours makes no synchronisation in a forward or backward pass, stock fairseq does, and ours
  makes fewer operator calls per update.
"""

from __future__ import annotations

import json
import sys

import forked_cli
from conftest import REPO, SHARED_DATA, require_data

from user_plugin.measurement.host_benchmark import RECORD_KEYS

NEWSTEST = SHARED_DATA / "newstest2014-en-de"


def test_tiny_host_benchmark_counts_stock_and_ours(tmp_path):
    require_data(NEWSTEST)
    out, details = tmp_path / "host.json", tmp_path / "details.json"
    proc = forked_cli.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_host.py"), "--json-out", str(out),
         "--details", str(details), "--lengths", str(NEWSTEST), "--layers", "1",
         "--runs", "stock-fp32,ours-fp32,ours-bf16", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [(r["impl"], r["precision"]) for r in records] == [
        ("stock", "fp32"), ("ours", "fp32"), ("ours", "bf16")]
    assert all(tuple(r) == RECORD_KEYS for r in records)
    stock, ours_fp32, ours_bf16 = records
    for record in (ours_fp32, ours_bf16):  # every update of ours makes the same calls
        for key in RECORD_KEYS[2:]:
            assert record[key] == int(record[key]), (record, key)
    assert stock["syncs_in_forward_backward"] > 0
    assert ours_fp32["syncs_in_forward_backward"] == 0 == ours_bf16["syncs_in_forward_backward"]
    assert ours_fp32["ops_per_update"] < 0.6 * stock["ops_per_update"]
    assert "ours fp32 / stock fp32: operators" in proc.stdout
    full = json.loads(details.read_text())
    assert full["ours-bf16"]["optimizer"] == "vaswani_adam"
    assert any("trainer.py" in where for where, _ in full["ours-fp32"]["sync_callers"])
    assert not list(tmp_path.glob("vaswani-host-benchmark-*"))  # its work files are gone


def test_an_unknown_run_is_one_error_line(tmp_path):
    proc = forked_cli.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_host.py"), "--json-out",
         str(tmp_path / "x.json"), "--runs", "ours-fp8"], capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "benchmark_host: error: no run named ours-fp8; known: " + ", ".join(
            ["stock-fp32", "stock-fp16", "stock-memory_efficient_fp16", "ours-fp32",
             "ours-fp16", "ours-bf16", "ours-bf16_autocast", "ours-memory_efficient_fp16"])]
    assert not (tmp_path / "x.json").exists()
