"""The Table 3 ablation recipe (recipes/ablation.sh wmt14_en_de) on a tiny real slice: 2000
Multi30k training pairs, 200 newstest2013 pairs as the dev set (word-level, joined dictionary),
two variants trained for 30 updates with tiny sizes, and the table it writes
(``vaswani-ablation-table``, user_plugin/commands/ablation_table.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import forked_cli
import pytest
from cli import REPO, command, fairseq_env, run_fairseq
from conftest import SHARED_DATA, require_data, tokenize_file

from user_plugin.commands import ablation_table
from user_plugin.files import UserError

ABLATION_SH = REPO / "recipes" / "ablation.sh"
PAIR = "wmt14_en_de"
VARIANTS = ["vaswani_table3_c_layers2", "vaswani_table3_d_ls0_0"]
TINY_EXTRA_ARGS = (
    "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 "
    "--decoder-ffn-embed-dim 64 --encoder-attention-heads 4 --decoder-attention-heads 4 "
    "--num-workers 0 --log-interval 10"
)


def recipe_env(data_bin: Path, ablation_dir: Path, **extra: str) -> dict:
    env = fairseq_env()
    env.update(
        VIRTUAL_ENV=sys.prefix,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DATA_BIN=str(data_bin), ABLATION_DIR=str(ablation_dir),
        VARIANTS=",".join(VARIANTS), DEVICE="cpu", PRECISION="fp32", MAX_UPDATE="30",
        MAX_TOKENS="2000",
        UPDATE_FREQ="1", WARMUP_UPDATES="10", REMOVE_BPE="", EVAL_MAX_TOKENS="4000", MAX_LEN_B="10",
        EXTRA_ARGS=TINY_EXTRA_ARGS, EVAL_ARGS="--num-workers 0",
    )
    env.update(extra)
    return env


def run_recipe(env: dict) -> subprocess.CompletedProcess:
    return forked_cli.run(["bash", str(ABLATION_SH), PAIR], env=env, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> SimpleNamespace:
    multi30k = require_data(SHARED_DATA / "multi30k-en-de")
    newstest = require_data(SHARED_DATA / "newstest2013-en-de")
    root = tmp_path_factory.mktemp("ablation")
    text = root / "text"
    text.mkdir()
    for lang in ("en", "de"):
        tokenize_file(multi30k / f"train.{lang}", text / f"train.{lang}", lang, 2000)
        tokenize_file(newstest / f"newstest2013.{lang}", text / f"valid.{lang}", lang, 200)
    data_bin = root / "data-bin"
    run_fairseq("preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
        "--trainpref", text / "train", "--validpref", text / "valid", "--destdir", data_bin,
        "--thresholdsrc", "2", "--thresholdtgt", "2", "--workers", "1",
    ])
    out = root / "results"
    env = recipe_env(data_bin, out)
    proc = run_recipe(env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return SimpleNamespace(data_bin=data_bin, out=out, env=env, log=proc.stderr)


def table_rows(markdown: str) -> list:
    """The data rows of the markdown table, as lists of cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[1:]]


def real_parameter_count(checkpoint: Path, data_bin: Path) -> int:
    from fairseq import checkpoint_utils

    models, _cfg = checkpoint_utils.load_model_ensemble(
        [str(checkpoint)], arg_overrides={"data": str(data_bin)}
    )
    return sum(p.numel() for p in models[0].parameters())


def test_table_has_one_row_per_variant_with_numeric_results(ablation):
    rows = table_rows((ablation.out / "table.md").read_text(encoding="utf-8"))
    assert [row["variant"] for row in rows] == [f"`{v}`" for v in VARIANTS]
    for row in rows:
        ppl, bleu = float(row["PPL (dev)"]), float(row["BLEU (dev)"])
        assert 1.0 < ppl < 1e6 and 0.0 <= bleu <= 100.0
        assert float(row["params ×10⁶"]) > 0


def test_params_are_the_trained_models_real_count(ablation):
    results = {r["variant"]: r for r in json.loads((ablation.out / "results.json").read_text())}
    rows = {row["variant"].strip("`"): row for row in
            table_rows((ablation.out / "table.md").read_text(encoding="utf-8"))}
    for variant in VARIANTS:
        checkpoint = ablation.out / variant / "checkpoints" / "checkpoint_last.pt"
        real = real_parameter_count(checkpoint, ablation.data_bin)
        assert results[variant]["params"] == real
        assert abs(float(rows[variant]["params ×10⁶"]) * 1e6 - real) <= 50


def test_rows_show_each_variants_change_and_the_tiny_overrides(ablation):
    results = {r["variant"]: r for r in json.loads((ablation.out / "results.json").read_text())}
    layers2, ls0 = results["vaswani_table3_c_layers2"], results["vaswani_table3_d_ls0_0"]
    assert (layers2["layers"], ls0["layers"]) == (2, 6)
    assert (layers2["label_smoothing"], ls0["label_smoothing"]) == (0.1, 0.0)
    assert layers2["d_model"] == ls0["d_model"] == 32 and layers2["train_steps"] == 30
    assert layers2["paper_ppl"] == 6.11 and ls0["paper_bleu"] == 25.3
    vocab = len((ablation.data_bin / "dict.en.txt").read_text(encoding="utf-8").splitlines()) + 4
    for result in (layers2, ls0):  # 30 updates learn far better than uniform guessing
        assert result["ppl"] < vocab / 4


def test_finished_variants_are_skipped_and_an_unfinished_one_resumes(ablation, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(ablation.out, out)
    unfinished = out / VARIANTS[1]
    (unfinished / ".done").unlink()
    (unfinished / "generate.log").unlink()
    train_log_size = (unfinished / "train.log").stat().st_size
    validate_mtime = (unfinished / "validate.log").stat().st_mtime_ns
    proc = run_recipe(recipe_env(ablation.data_bin, out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"skipping {VARIANTS[0]}" in proc.stderr
    assert f"training {VARIANTS[1]}: already done" in proc.stderr
    assert (unfinished / "train.log").stat().st_size == train_log_size
    assert (unfinished / "validate.log").stat().st_mtime_ns == validate_mtime
    assert ablation_table.parse_bleu((unfinished / "generate.log").read_text(), "generate.log") \
        == json.loads((ablation.out / "results.json").read_text())[1]["bleu"]
    assert (unfinished / ".done").is_file()
    assert len(table_rows((out / "table.md").read_text(encoding="utf-8"))) == 2


def test_unknown_variant_fails_in_one_line_before_training(ablation, tmp_path):
    out = tmp_path / "results"
    proc = run_recipe(recipe_env(ablation.data_bin, out, VARIANTS="vaswani_table3_c_layers2,nope"))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    expected = ("ablation: error: VARIANTS: unknown architecture 'nope' (the Table 3 ones: "
                "vaswani-ablation-table list)")
    assert errors == [expected]
    assert not out.exists()


# -- the table script on its own ------------------------------------------------------------------

VALIDATE_LINE = ("2026-01-01 00:00:00 | INFO | valid | valid on 'valid' subset | loss 6.049 | "
                 "nll_loss 5.5 | ppl 45.25 | wps 0 | wpb 4413 | bsz 200")
GENERATE_LINE = ("Generate valid with beam=4: BLEU4 = 25.81, 57.1/31.8/19.9/12.9 (BP=1.000, "
                 "ratio=1.010, syslen=65000, reflen=64350)")


def test_log_parsers_read_fairseqs_summary_lines():
    assert ablation_table.parse_validation(f"noise\n{VALIDATE_LINE}\n", "valid", "v") == {
        "loss": 6.049, "nll_loss": 5.5, "ppl": 45.25, "wps": 0.0, "wpb": 4413.0, "bsz": 200.0}
    assert ablation_table.parse_bleu(f"H-1\tx\n{GENERATE_LINE}\n", "g") == 25.81
    sacre = "Generate valid with beam=4: BLEU = 24.10 56.0/30.1/18.8/12.0 (BP = 1.000 ...)"
    assert ablation_table.parse_bleu(sacre, "g") == 24.10
    assert ablation_table.parse_params(
        "x | num. shared model params: 63,080,960 (num. trained: 63,080,960)", "t") == 63_080_960


@pytest.mark.parametrize("parser, text, message", [
    (lambda t: ablation_table.parse_validation(t, "valid", "v.log"), "no summary here",
     "v.log: no \"valid on 'valid' subset\" summary"),
    (lambda t: ablation_table.parse_validation(t, "test", "v.log"), VALIDATE_LINE,
     "v.log: no \"valid on 'test' subset\" summary"),
    (lambda t: ablation_table.parse_bleu(t, "g.log"), "Generate valid with beam=4: nothing",
     "g.log: no 'Generate ... BLEU' line"),
    (lambda t: ablation_table.parse_params(t, "t.log"), "", "t.log: no 'num. shared model"),
])
def test_log_parsers_name_the_file_they_cannot_read(parser, text, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parser(text)


def test_params_format_like_table3():
    assert ablation_table.format_millions(63_080_960) == "63.08"
    assert ablation_table.format_millions(128_256) == "0.1283"


def test_collect_reports_a_missing_log_in_one_line(ablation, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(ablation.out, out)
    (out / VARIANTS[0] / "validate.log").unlink()
    proc = forked_cli.run(
        [*command("ablation_table"), "collect", "--results-dir", str(out),
         "--output", str(out / "new.md")],
        capture_output=True, text=True, env=fairseq_env(), timeout=120, check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"vaswani-ablation-table: error: {out / VARIANTS[0] / 'validate.log'}: no such file")
    assert "Traceback" not in proc.stderr and not (out / "new.md").exists()
