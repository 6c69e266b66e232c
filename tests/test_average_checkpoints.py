"""Checkpoint averaging (paper §6.1: the last 5 checkpoints for base models, 20 for big ones)."""

from __future__ import annotations

import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import command
from conftest import MULTI30K, REPO, require_data

from user_plugin.artifacts import averaging as avg
from user_plugin.commands import average_checkpoints
from user_plugin.files import UserError, run_main

USER_DIR = str(REPO / "user_plugin")


def fake_checkpoint(path: Path, seed: int, **changes) -> dict:
    """A small checkpoint in fairseq's layout: tied embeddings, an fp16 tensor, an int buffer,
    optimizer state and an EMA copy. ``changes`` replace (or, with None, remove) model entries."""
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(10, 4, generator=gen)
    model = {
        "encoder.embed_tokens.weight": embed,
        "decoder.output_projection.weight": embed,
        "encoder.layers.0.fc1.weight": torch.randn(6, 4, generator=gen),
        "encoder.layers.0.fc1.bias": torch.randn(6, generator=gen).half(),
        "encoder.version": torch.tensor([3]),
    }
    for key, value in changes.items():
        if value is None:
            del model[key]
        else:
            model[key] = value
    state = {
        "args": None,
        "cfg": {"model": {"_name": "vaswani_base"}, "common": {"seed": seed}},
        "model": model,
        "criterion": None,
        "optimizer_history": [{"optimizer_name": "FairseqAdam", "num_updates": 100 * seed}],
        "task_state": {},
        "extra_state": {"epoch": 1, "ema": {"w": torch.zeros(3)}},
        "last_optimizer_state": {"state": {0: {"exp_avg": torch.ones(1000)}}},
    }
    torch.save(state, path)
    return model


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    """Run the script's main in this process as its command line does; (status, stderr)."""
    status = run_main(average_checkpoints.main, args, average_checkpoints.PROG)
    return status, capsys.readouterr().err


def test_mean_of_three_checkpoints_is_exact(tmp_path):
    paths = [tmp_path / f"c{i}.pt" for i in range(3)]
    models = [fake_checkpoint(path, seed) for seed, path in enumerate(paths, start=1)]
    state = avg.average_checkpoints(paths)
    out = state["model"]
    for key in ("encoder.embed_tokens.weight", "encoder.layers.0.fc1.weight",
                "encoder.layers.0.fc1.bias"):
        stacked = torch.stack([model[key].double() for model in models])
        expected = stacked.mean(dim=0).to(models[0][key].dtype)
        assert out[key].dtype == models[0][key].dtype
        assert torch.equal(out[key], expected), key
        assert not torch.equal(out[key], models[0][key])
    assert torch.equal(out["encoder.version"], torch.tensor([3]))
    # Tied in the inputs (shared embeddings), tied in the output.
    assert out["decoder.output_projection.weight"] is out["encoder.embed_tokens.weight"]
    # Other fields from the first checkpoint; no optimizer state, no EMA copy.
    assert state["cfg"]["common"]["seed"] == 1
    assert state["optimizer_history"][-1]["num_updates"] == 100
    assert "last_optimizer_state" not in state and "ema" not in state["extra_state"]
    assert state["averaged_from"] == ["c0.pt", "c1.pt", "c2.pt"]


def test_cli_writes_a_small_safe_loadable_checkpoint(tmp_path, capsys):
    paths = [tmp_path / f"c{i}.pt" for i in range(2)]
    for seed, path in enumerate(paths, start=1):
        fake_checkpoint(path, seed)
    output = tmp_path / "out" / "avg.pt"
    status, err = run_cli(["--inputs", *map(str, paths), "--output", str(output)], capsys)
    assert status == 0, err
    loaded = torch.load(output, map_location="cpu", weights_only=True)
    assert set(loaded["model"]) == set(torch.load(paths[0], weights_only=True)["model"])
    assert output.stat().st_size < paths[0].stat().st_size / 2  # optimizer state dropped
    assert sorted(p.name for p in output.parent.iterdir()) == ["avg.pt"]  # no temp file left


@pytest.mark.parametrize("change, words", [
    ({"encoder.layers.0.fc2.weight": torch.zeros(2)}, ["'encoder.layers.0.fc2.weight'", "c1.pt"]),
    ({"encoder.layers.0.fc1.bias": None}, ["'encoder.layers.0.fc1.bias'", "c1.pt", "c0.pt"]),
    ({"encoder.embed_tokens.weight": torch.zeros(12, 4),
      "decoder.output_projection.weight": torch.zeros(12, 4)},
     ["'encoder.embed_tokens.weight'", "[12, 4]", "[10, 4]", "c1.pt", "c0.pt"]),
], ids=["extra-key", "missing-key", "other-vocabulary"])
def test_mismatched_checkpoints_are_refused_and_nothing_is_written(tmp_path, capsys, change,
                                                                   words):
    fake_checkpoint(tmp_path / "c0.pt", 1)
    fake_checkpoint(tmp_path / "c1.pt", 2, **change)
    fresh, existing = tmp_path / "fresh.pt", tmp_path / "existing.pt"
    existing.write_bytes(b"previous average")
    before = sorted(p.name for p in tmp_path.iterdir())
    for output in (fresh, existing):
        status, err = run_cli(["--inputs", str(tmp_path / "c0.pt"), str(tmp_path / "c1.pt"),
                               "--output", str(output)], capsys)
        assert status == 1
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        for word in words:
            assert word in err
    assert not fresh.exists()
    assert existing.read_bytes() == b"previous average"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_untied_copies_that_differ_are_refused(tmp_path):
    fake_checkpoint(tmp_path / "c0.pt", 1)
    fake_checkpoint(tmp_path / "c1.pt", 2, **{"decoder.output_projection.weight":
                                                torch.zeros(10, 4)})
    with pytest.raises(UserError, match="tied in .*c0.pt but differ here"):
        avg.average_checkpoints([tmp_path / "c0.pt", tmp_path / "c1.pt"])


def test_integer_buffers_must_agree(tmp_path):
    fake_checkpoint(tmp_path / "c0.pt", 1)
    fake_checkpoint(tmp_path / "c1.pt", 2, **{"encoder.version": torch.tensor([2])})
    with pytest.raises(UserError, match="'encoder.version' differs"):
        avg.average_checkpoints([tmp_path / "c0.pt", tmp_path / "c1.pt"])


def test_a_file_given_twice_is_used_once(tmp_path, capsys):
    model = fake_checkpoint(tmp_path / "c0.pt", 1)
    fake_checkpoint(tmp_path / "c1.pt", 2)
    again = tmp_path / ".." / tmp_path.name / "c0.pt"
    state = avg.average_checkpoints([tmp_path / "c0.pt", again])
    assert state["averaged_from"] == ["c0.pt"]
    for key, tensor in model.items():
        assert torch.equal(state["model"][key], tensor), key
    notes = [line for line in capsys.readouterr().err.splitlines() if "same parameters" in line]
    assert len(notes) == 1 and f"{again} holds the same parameters as {tmp_path / 'c0.pt'}" in \
        notes[0]


@pytest.mark.parametrize("content, reason", [
    (None, "no such file"),
    (b"", "not a readable PyTorch checkpoint"),
    (b"plain text\n", "not a readable PyTorch checkpoint"),
])
def test_unreadable_inputs_are_one_line_errors(tmp_path, capsys, content, reason):
    fake_checkpoint(tmp_path / "good.pt", 1)
    bad = tmp_path / "bad.pt"
    if content is not None:
        bad.write_bytes(content)
    status, err = run_cli(["--inputs", str(tmp_path / "good.pt"), str(bad), "--output",
                           str(tmp_path / "out.pt")], capsys)
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert str(bad) in err and reason in err
    assert not (tmp_path / "out.pt").exists()


def test_no_model_entry_is_refused(tmp_path):
    torch.save({"cfg": {}}, tmp_path / "c0.pt")
    with pytest.raises(UserError, match=r"c0.pt: not a fairseq checkpoint \(no 'model' entry\)"):
        avg.average_checkpoints([tmp_path / "c0.pt"])


def test_truncated_checkpoint_is_a_one_line_error_of_the_script(tmp_path):
    fake_checkpoint(tmp_path / "good.pt", 1)
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "cwd").mkdir()
    result = forked_cli.run(
        [*command("average_checkpoints"), "--inputs", "../good.pt", "../truncated.pt",
         "--output", "../avg.pt"],
        cwd=tmp_path / "cwd", capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "../truncated.pt" in lines[0] and "not a readable PyTorch checkpoint" in lines[0]
    assert not (tmp_path / "avg.pt").exists()


def make_checkpoint_names(directory: Path, names: list[str]) -> None:
    for name in names:
        (directory / name).write_bytes(b"")


def test_selects_the_last_update_checkpoints_by_number(tmp_path):
    make_checkpoint_names(tmp_path, [
        "checkpoint_1_100.pt", "checkpoint_1_200.pt", "checkpoint_2_300.pt",
        "checkpoint_2_1000.pt", "checkpoint_3_1100.pt", "checkpoint3.pt", "checkpoint_last.pt",
        "checkpoint_best.pt", "checkpoint_avg.pt", ".checkpoint_3_1200.pt.x1.tmp"])
    names = [p.name for p in avg.select_checkpoints(tmp_path, 3, "update")]
    assert names == ["checkpoint_3_1100.pt", "checkpoint_2_1000.pt", "checkpoint_2_300.pt"]
    bounded = [p.name for p in avg.select_checkpoints(tmp_path, 3, "update", upper_bound=1000)]
    assert bounded == ["checkpoint_2_1000.pt", "checkpoint_2_300.pt", "checkpoint_1_200.pt"]
    with pytest.raises(UserError, match=r"last 4 .* with update <= 300, found 3"):
        avg.select_checkpoints(tmp_path, 4, "update", upper_bound=300)


def test_selects_the_last_epoch_checkpoints_by_number(tmp_path):
    make_checkpoint_names(tmp_path, ["checkpoint1.pt", "checkpoint2.pt", "checkpoint10.pt",
                                     "checkpoint_10_5000.pt", "checkpoint_last.pt"])
    assert [p.name for p in avg.select_checkpoints(tmp_path, 2, "epoch")] == [
        "checkpoint10.pt", "checkpoint2.pt"]
    assert [p.name for p in avg.select_checkpoints(tmp_path, 2, "epoch", upper_bound=9)] == [
        "checkpoint2.pt", "checkpoint1.pt"]
    with pytest.raises(UserError, match="found 3"):
        avg.select_checkpoints(tmp_path, 5, "epoch")


@pytest.mark.parametrize("args, message", [
    (["--num-update-checkpoints", "2"], "needs --inputs to be one directory"),
    (["--checkpoint-upper-bound", "5"], "--checkpoint-upper-bound needs"),
])
def test_inconsistent_options_are_refused(tmp_path, capsys, args, message):
    fake_checkpoint(tmp_path / "c0.pt", 1)
    status, err = run_cli(["--inputs", str(tmp_path / "c0.pt"), "--output",
                           str(tmp_path / "o.pt"), *args], capsys)
    assert status == 1 and message in err


def test_a_directory_needs_a_count(tmp_path, capsys):
    status, err = run_cli(["--inputs", str(tmp_path), "--output", str(tmp_path / "o.pt")], capsys)
    assert status == 1 and "--num-update-checkpoints" in err


# --- with real fairseq checkpoints -------------------------------------------------------------

TINY_MODEL = ["--arch", "vaswani_base", "--encoder-layers", "1", "--decoder-layers", "1",
              "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
              "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
              "--share-all-embeddings"]


def fairseq(module: str, *args: str, cwd: Path) -> str:
    """Run a fairseq command line (``python -m fairseq_cli.<module>``); its output."""
    result = forked_cli.run([sys.executable, "-m", f"fairseq_cli.{module}", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three update checkpoints of a tiny model trained for 3 updates on 200 Multi30k pairs."""
    data = require_data(MULTI30K)
    work = tmp_path_factory.mktemp("averaging")
    for split, source, lines in (("train", "train", 200), ("valid", "val", 20)):
        for lang in ("en", "de"):
            with open(data / f"{source}.{lang}", encoding="utf-8") as handle:
                head = [next(handle) for _ in range(lines)]
            (work / f"{split}.{lang}").write_text("".join(head), encoding="utf-8")
    fairseq("preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", "train",
            "--validpref", "valid", "--destdir", "bin", "--joined-dictionary", "--workers", "1",
            cwd=work)
    fairseq("train", "bin", "--user-dir", USER_DIR, "--cpu", *TINY_MODEL,
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-9",
            "--lr", "1", "--lr-scheduler", "vaswani_inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "vaswani_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", "500", "--max-update", "3", "--save-interval-updates", "1",
            "--disable-validation", "--save-dir", "checkpoints", "--seed", "1",
            "--num-workers", "0", "--no-progress-bar", "--log-format", "simple", cwd=work)
    return work


def test_averaged_fairseq_checkpoint_loads_and_generates(trained, tmp_path, capsys):
    output = tmp_path / "checkpoint_avg3.pt"
    status, err = run_cli(["--inputs", str(trained / "checkpoints"),
                           "--num-update-checkpoints", "3", "--output", str(output)], capsys)
    assert status == 0, err
    inputs = [trained / "checkpoints" / f"checkpoint_1_{update}.pt" for update in (3, 2, 1)]
    state = torch.load(output, map_location="cpu", weights_only=True)
    assert state["averaged_from"] == [path.name for path in inputs]
    assert state["optimizer_history"][-1]["num_updates"] == 3  # the newest one's fields
    assert output.stat().st_size < inputs[0].stat().st_size / 2  # no Adam moments

    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(output)], arg_overrides={"data": str(trained / "bin")})
    parameters = models[0].state_dict()
    originals = [torch.load(path, weights_only=True)["model"] for path in inputs]
    for key, value in parameters.items():
        mean = torch.stack([model[key].double() for model in originals]).mean(dim=0)
        assert torch.equal(value, mean.to(value.dtype)), key
    assert len(task.target_dictionary) == parameters["decoder.output_projection.weight"].shape[0]

    log = fairseq("generate", str(trained / "bin"), "--user-dir", USER_DIR, "--path",
                  str(output), "--cpu", "--gen-subset", "valid", "--beam", "2",
                  "--max-len-a", "0", "--max-len-b", "5", "--batch-size", "20",
                  "--required-batch-size-multiple", "1", "--num-workers", "0", cwd=tmp_path)
    hypotheses = [line for line in log.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 20
