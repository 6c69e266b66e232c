"""The benchmark compares like with like: same weights, same batches, same hypotheses.

Wall time is printed by the script, never asserted (issue 5): this test runs it at toy sizes and
checks what makes its ratios meaningful.
"""

import json
import math
import subprocess
import sys

from conftest import MULTI30K, REPO, require_data


def test_benchmark_runs_both_models_on_the_same_work_and_reports_ratios(tmp_path):
    require_data(MULTI30K / "train.en")
    out = tmp_path / "bench.json"
    command = [
        sys.executable, "scripts/benchmark.py", "--model", "tiny", "--pairs", "300",
        "--vocab", "600", "--train-batches", "2", "--max-tokens", "400", "--dropout", "0",
        "--decode-sentences", "6", "--decode-batch", "3", "--max-len-b", "5", "--repeats", "1",
        "--sweep", "8", "--sweep-tokens", "32", "--sweep-steps", "1", "--decode-sweep", "3",
        "--decode-sweep-sentences", "2", "--work-dir", str(tmp_path / "work"),
        "--json-out", str(out),
    ]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    # same weights and batches: without dropout the first training loss is the same
    ours = result["runs"]["train"]["ours"][0]
    builtin = result["runs"]["train"]["builtin"][0]
    assert ours["tokens"] == builtin["tokens"] > 0
    assert math.isclose(ours["first_loss"], builtin["first_loss"], rel_tol=1e-4)
    # same beam search: identical hypotheses, in the main run and in the length sweep
    assert result["identical_hypotheses"] is True
    assert [row["identical_hypotheses"] for row in result["decode_sweep"]] == [True]
    sweep_tokens = [r["ours"]["tokens"] for r in result["decode_sweep"]]
    assert sweep_tokens == [2 * (3 + 1)]  # two sentences, exactly 3 tokens + EOS each
    summary = result["summary"]["training target tokens/s"]
    assert math.isclose(summary["ratio"], summary["ours"] / summary["builtin"])
    assert "| training target tokens/s |" in proc.stdout
    assert "identical beam-search hypotheses: True" in proc.stdout
