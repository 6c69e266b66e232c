"""scripts/benchmark_serving.py in its ``--quick`` mode (tiny sizes; its figures mean nothing
and are not checked) on both backends: every phase runs (the throughput runs driven by wrk
where it is installed), every request is answered or refused with 503 and none is lost or
answered differently from one-at-a-time, the soak reads the server's memory, and every server
exits 0 after SIGTERM."""

import json
import shutil
import sys

import forked_cli
import pytest
from cli import REPO, fairseq_env
from conftest import MULTI30K, require_data
from serving import ctranslate2_export, hub_model_dir


def test_quick_benchmark_runs_on_both_backends(trained_multi30k, tmp_path):
    pytest.importorskip("ctranslate2",
                        reason="ctranslate2 is not installed (the test extra has it)")
    model = hub_model_dir(trained_multi30k, tmp_path / "model")
    export = ctranslate2_export(trained_multi30k, tmp_path / "ct2", "--quantization", "int8")
    out = tmp_path / "serving.json"
    proc = forked_cli.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_serving.py"), "--quick",
         "--fairseq", str(model), "--fairseq-args", "--source-lang en --target-lang de",
         "--ctranslate2", str(export),
         "--sentences", str(require_data(MULTI30K) / "test_2016_flickr.en"),
         "--reference", str(MULTI30K / "test_2016_flickr.de"), "--json-out", str(out)],
        env=fairseq_env(), capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert [r["backend"] for r in report["results"]] == ["fairseq", "ctranslate2"]
    for result in report["results"]:
        runs = [*result["batched"].values(), *result["one_at_a_time"].values(),
                *result["overload"].values(), result["soak"]]
        assert set(result["batched"]) == set(result["one_at_a_time"]) == {"1", "4"}
        throughput = [*result["batched"].values(), *result["one_at_a_time"].values()]
        for run in runs:
            assert run["lost"] == 0 and run["lost_causes"] == {}
            assert run["answered"] + run["refused_503"] == run["requests"] > 0
            # wrk counts answers; the Python client's runs check every text too
            assert run["differ"] == (None if run in throughput and
                                     result["load_generator"] == "wrk" else 0)
        if shutil.which("wrk"):
            assert result["load_generator"] == "wrk"
            assert all(run["load_generator"] == "wrk" for run in throughput)
        assert result["soak"]["rss_start_kib"] > 0 and result["soak"]["rss_end_kib"] > 0
        assert result["batched_exit_status"] == result["one_at_a_time_exit_status"] == 0
        assert 0 <= result["sacrebleu"] <= 100
    assert "| fairseq | 4 |" in proc.stdout and "| ctranslate2 | 4x" in proc.stdout
