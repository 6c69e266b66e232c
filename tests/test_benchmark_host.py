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
import pytest
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


def test_host_operator_shares_sort_the_profiled_time_into_its_parts():
    import torch

    from user_plugin.measurement.train_step_probe import host_operator_shares, shares_line

    x = torch.randn(96, 96, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        with torch.profiler.record_function("train_step-1"):
            for _ in range(3):
                y = (x @ x).relu()
                q = y[None, None]
                out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
                (out.sum() + y.sum()).backward()
    events = profile.events()
    shares = host_operator_shares(events, top=3)
    parts = ("matrix_products", "attention_kernels", "python_between_operators",
             "other_operators")
    assert sum(shares[p] for p in parts) == pytest.approx(1.0)
    assert all(shares[p] > 0 for p in parts)
    # each part is the self time of exactly its operators
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.name == "aten::mm")
    assert shares["matrix_products"] == pytest.approx(products / total)
    assert len(shares["largest_other_operators"]) == 3
    assert not any(name == "aten::mm" or "scaled_dot_product" in name
                   for name in shares["largest_other_operators"])
    line = shares_line(shares)
    assert line.startswith(f"matrix products {100 * shares['matrix_products']:.1f} %")


@pytest.mark.parametrize("env, message", [
    ({"PROFILE": "0"}, "PROFILE: '0' is not a number of updates from 1 to UPDATES - 1 (149)"),
    ({"PROFILE": "150"}, "PROFILE: '150' is not a number of updates from 1 to UPDATES - 1 (149)"),
    ({"UPDATES": "1"}, "UPDATES: '1' is not a number of updates of at least 2"),
    ({"ROUNDS": "two"}, "ROUNDS: 'two' is not a positive number"),
    ({"JSON_OUT": "/no such folder/r.json"},
     "JSON_OUT: '/no such folder/r.json' is not a file path in an existing folder"),
    ({"JSON_OUT": "/dev/null"}, "JSON_OUT: /dev/null: a character device, not a regular file; "
     "an output is written as a new file and moved into place, which would replace it: give "
     "the path of a regular file (nothing was written)"),
    ({"JSON_OUT": "{data_bin}/r.json"}, "JSON_OUT: {data_bin}/r.json: lies inside the input "
     "directory {data_bin}; an output never changes an input: choose an output path outside it "
     "(nothing was written)"),
])
def test_compare_cpu_training_refuses_bad_settings_in_one_line(tmp_path, env, message):
    import os

    data_bin = tmp_path / "data bin ü"
    data_bin.mkdir()
    env = {key: value.format(data_bin=data_bin) for key, value in env.items()}
    proc = forked_cli.run(
        ["bash", str(REPO / "scripts" / "compare_cpu_training.sh")],
        env=dict(os.environ, DATA_BIN=str(data_bin), VENV=str(REPO / ".venv"), **env),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [message.format(data_bin=data_bin)]


def test_compare_cpu_training_writes_its_rounds_and_ratios_as_json(multi30k_bin, tmp_path):
    """Two rounds of 4 updates, stock and ours in float32, on the Multi30k slice: the JSON
    holds each round's rate and loss, and medians and ratios computed from them, with the
    CPU's name and flags; the printed summary says the same."""
    import os
    import statistics

    out = tmp_path / "out ü" / "training.json"
    out.parent.mkdir()
    proc = forked_cli.run(
        ["bash", str(REPO / "scripts" / "compare_cpu_training.sh")],
        env=dict(os.environ, DATA_BIN=str(multi30k_bin.data_bin), VENV=str(REPO / ".venv"),
                 UPDATES="4", ROUNDS="2", RUNS="stock-fp32 ours-fp32", JSON_OUT=str(out),
                 OMP_NUM_THREADS="1"),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["machine"]["cpu"] and isinstance(report["machine"]["flags"], list)
    assert report["settings"]["updates"] == 4 and report["settings"]["rounds"] == 2
    rates = report["target_tokens_per_s"]
    assert list(rates) == ["stock-fp32", "ours-fp32"]
    assert all(len(values) == 2 and min(values) > 0 for values in rates.values())
    assert all(len(values) == 2 for values in report["last_logged_loss"].values())
    ratios = [ours / stock for ours, stock in zip(rates["ours-fp32"], rates["stock-fp32"])]
    assert report["round_by_round_vs_baseline"]["ours-fp32"] == pytest.approx(ratios)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    assert report["median_vs_baseline"]["ours-fp32"] == pytest.approx(
        medians["ours-fp32"] / medians["stock-fp32"])
    printed = [line for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert len(printed) == 4
    assert f"ours-fp32 {medians['ours-fp32']:,.0f} " in proc.stdout
    assert not [p for p in out.parent.iterdir() if p.name != out.name]  # no temporary left

