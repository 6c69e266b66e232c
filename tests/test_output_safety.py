"""An output never is, holds or lies inside an input, nor is a training checkpoint: the shared
check of the writing layer (``user_plugin.files.atomic.refuse_input_clash``, with
``user_plugin.files.training_state``) and every command that writes.

The matrix of cases, outcomes and tests is docs/faults.md ("Outputs that swallow inputs").
Files that a refused command must leave alone are compared by sha256 before and after
(``fault_injection.snapshot``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import REPO
from fault_injection import snapshot
from test_fault_classes import one_error_line, tiny_checkpoint

from user_plugin.files import UserError, atomic_write_text, refuse_input_clash, run_main
from user_plugin.files.training_state import (
    TRAINING_LOCK,
    holds_optimizer_state,
    training_checkpoint_problem,
)


def export(*args) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", "user_plugin.export", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def export_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused export (after its ``exporting ...`` line)."""
    return one_error_line("\n".join(line for line in proc.stderr.splitlines()
                                    if not line.startswith("exporting ")))


def fake_export(directory: Path, files: dict[str, str] | None = None) -> Path:
    """A directory with the manifest of one of our exports listing ``files`` (name -> text)."""
    directory.mkdir(parents=True)
    files = files or {"model.bin": "weights"}
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    manifest = {"format": "vaswani-ctranslate2/1", "files": {
        name: {"bytes": len(text.encode()), "sha256": "0" * 64} for name, text in files.items()}}
    (directory / "vaswani_export.json").write_text(json.dumps(manifest), encoding="utf-8")
    return directory


# --------------------------------------------------------------------------------------------
# The rules of the writing layer


def test_an_output_that_holds_an_input_or_lies_inside_one_is_refused(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    source = data / "sub" / "in.txt"
    source.write_text("keep me\n", encoding="utf-8")
    (tmp_path / "link").symlink_to(data, target_is_directory=True)
    before = snapshot(tmp_path)
    for output, inputs, words in [
        (data, [source], "holds the input"),  # a directory written whole would delete it
        (tmp_path / "link", [source], "holds the input"),  # reached through a symbolic link
        (data, [tmp_path / "link" / "sub" / "in.txt"], "holds the input"),
        (data / "sub" / "new.txt", [data], "lies inside the input directory"),
        (tmp_path / "link" / "deeper" / "new.txt", [data], "lies inside the input directory"),
    ]:
        with pytest.raises(UserError, match=words):
            refuse_input_clash(output, inputs)
    with pytest.raises(UserError, match="lies inside the input directory"):
        atomic_write_text(data / "new.txt", "x\n", inputs=[data])
    assert snapshot(tmp_path) == before
    refuse_input_clash(tmp_path / "beside.txt", [data, source])  # beside them: allowed
    refuse_input_clash(data / "sub", [data / "other.txt"])  # a directory beside a file input


def test_training_checkpoints_are_recognised_by_their_optimizer_state_and_save_directory(
        tmp_path):
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    last = tiny_checkpoint(save_dir / "checkpoint_last.pt", last_optimizer_state={"step": 20})
    interval = tiny_checkpoint(save_dir / "checkpoint_1_20.pt",
                               last_optimizer_state={"step": 20})
    averaged = tiny_checkpoint(tmp_path / "averaged.pt")
    state = tiny_checkpoint(tmp_path / "my_state.pt", last_optimizer_state={"step": 3})
    assert holds_optimizer_state(last) and holds_optimizer_state(state)
    assert not holds_optimizer_state(averaged)
    assert "holds an optimizer state" in training_checkpoint_problem(last)
    assert "holds an optimizer state" in training_checkpoint_problem(state)  # any name
    for name in ("checkpoint_best.pt", "checkpoint3.pt", "checkpoint_1_30.pt",
                 "checkpoint.best_loss_4.21.pt", "checkpoint_last-shard0.pt"):
        problem = training_checkpoint_problem(save_dir / name)
        assert problem is not None and "save directory of a training run" in problem, name
        assert "checkpoint_1_20.pt there holds an optimizer state" in problem
    for path in (save_dir / "checkpoint_avg.pt", save_dir / "model.pt", averaged,
                 tmp_path / "checkpoint_last.pt"):  # not a save directory: no checkpoints
        assert training_checkpoint_problem(path) is None, path
    interval.unlink()
    last.unlink()
    assert training_checkpoint_problem(save_dir / "checkpoint_last.pt") is None
    (save_dir / TRAINING_LOCK).write_text("pid 1\n", encoding="utf-8")  # a live run, no save yet
    assert "holds the lock of a training run" in \
        training_checkpoint_problem(save_dir / "checkpoint_last.pt")
    # a training run saving its own checkpoints is allowed
    refuse_input_clash(save_dir / "checkpoint_last.pt", training_save=True)


def test_a_checkpoint_pickle_is_read_without_running_anything(tmp_path):
    """The optimizer state is found by reading the pickle record only: a file naming a class
    or function of its own never has it imported or called."""
    import pickle
    import zipfile

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(
            {"last_optimizer_state": Payload(), "model": {}}))
    assert holds_optimizer_state(path)
    assert not (tmp_path / "ran").exists()
    (tmp_path / "text.pt").write_text("not a checkpoint\n", encoding="utf-8")
    assert not holds_optimizer_state(tmp_path / "text.pt")


# --------------------------------------------------------------------------------------------
# The export: the cases of the round


@pytest.mark.parametrize("target", ["ctranslate2", "transformers"])
def test_export_into_an_export_directory_that_holds_its_input_is_refused(target, tmp_path):
    """``vaswani-export exp1/my_model.pt --output exp1`` (before: exit 0, the input deleted
    with the old export), and the input in a subfolder of the output."""
    exp1 = fake_export(tmp_path / "exp1")
    inside = exp1 / "my_model.pt" if target == "ctranslate2" else exp1 / "sub" / "in.pt"
    inside.parent.mkdir(exist_ok=True)
    tiny_checkpoint(inside)
    data = tmp_path / "data-bin"
    data.mkdir()
    before = snapshot(tmp_path)
    proc = export(inside, "--data-dir", data, "--to", target, "--output", exp1)
    line = export_error_line(proc)
    assert proc.returncode == 1 and f"{exp1}: holds the input {inside}" in line
    assert snapshot(tmp_path) == before


def test_export_onto_a_training_checkpoint_is_refused(trained_multi30k, tmp_path):
    """``--to fairseq --output SAVE_DIR/checkpoint_last.pt`` (before: exit 0, the training state
    replaced by an inference checkpoint), and a checkpoint name the run would resume from."""
    save_dir = tmp_path / "checkpoints"
    shutil.copytree(trained_multi30k.checkpoint_dir, save_dir,
                    ignore=shutil.ignore_patterns("*.lock"))
    model = tmp_path / "model.pt"
    tiny_checkpoint(model)
    before = snapshot(tmp_path)
    for name, words in (("checkpoint_last.pt", "is a training checkpoint (it holds an "
                                               "optimizer state"),
                        ("checkpoint_1_80.pt", "is a name fairseq-train gives the checkpoints "
                                               "it resumes from")):
        proc = export(model, "--data-dir", trained_multi30k.data_bin, "--to", "fairseq",
                      "--output", save_dir / name)
        line = export_error_line(proc)
        assert proc.returncode == 1 and f"{save_dir / name}: {words}" in line, line
        assert snapshot(tmp_path) == before


def test_export_into_the_data_directory_it_reads_is_refused(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "checkpoint.pt")
    data = tmp_path / "data-bin"
    data.mkdir()
    (data / "dict.en.txt").write_text("a 1\n", encoding="utf-8")
    before = snapshot(tmp_path)
    for target, output in (("ctranslate2", data / "ct2"), ("fairseq", data / "model.pt")):
        proc = export(checkpoint, "--data-dir", data, "--to", target, "--output", output)
        line = export_error_line(proc)
        assert proc.returncode == 1 and f"lies inside the input directory {data}" in line
    assert snapshot(tmp_path) == before


def test_an_export_holding_files_it_does_not_list_is_not_replaced(tmp_path):
    """An earlier export is replaced whole only when it holds nothing but what its manifest
    lists: a file the user put there would be deleted with it."""
    from user_plugin.artifacts.errors import ArtifactError
    from user_plugin.artifacts.written_directory import refuse_foreign_output

    exp1 = fake_export(tmp_path / "exp1")
    refuse_foreign_output(exp1, "ctranslate2")  # only its own files: may be replaced
    (exp1 / "notes.txt").write_text("mine\n", encoding="utf-8")
    with pytest.raises(ArtifactError, match=f"{exp1}: holds {exp1 / 'notes.txt'}, which is "
                                            "not part of the export"):
        refuse_foreign_output(exp1, "ctranslate2")


# --------------------------------------------------------------------------------------------
# Every command that writes


CASES = {
    "average into a directory holding its inputs": (
        "average_checkpoints", ["--inputs", "{a}", "{b}", "--output", "{inputs}"]),
    "average onto checkpoint_last.pt of a save directory": (
        "average_checkpoints", ["--inputs", "{a}", "{b}", "--output",
                                "{inputs}/checkpoint_last.pt"]),
    "score into a directory holding its hypotheses": (
        "score_translation", ["--hyp", "{text}", "--ref", "{text}", "--target-lang", "de",
                              "--output-json", "{inputs}"]),
    "parse-eval over its gold trees": (
        "parse_eval", ["--gold", "{tree}", "--pred", "{tree}", "--json-out", "{tree}"]),
    "plot-training into a directory holding its log": (
        "plot_training", ["{log}", "--output", "{inputs}"]),
    "prepare-trees inside its treebank": (
        "prepare_trees", ["prepare", "--ptb-dir", "{inputs}", "--out-dir", "{inputs}/prepared"]),
    "delinearize over its words": (
        "prepare_trees", ["delinearize", "--words", "{text}", "--hypotheses", "{text}",
                          "--output", "{text}"]),
    "plot-attention inside its data directory": (
        "plot_attention", ["--checkpoint", "{a}", "--data-dir", "{inputs}", "--source", "x",
                           "--out-dir", "{inputs}/pictures"]),
    "ablation-table inside a result directory it reads": (
        "ablation_table", ["collect", "--results-dir", "{root}", "--variants", "inputs",
                           "--output", "{inputs}/table.md"]),
}


@pytest.mark.parametrize("case", CASES)
def test_every_writing_command_refuses_an_output_that_holds_or_lies_inside_an_input(
        case, tmp_path, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    text, tree, log = inputs / "text.de", inputs / "gold.txt", inputs / "train.log"
    text.write_text("Ein Hund .\n", encoding="utf-8")
    tree.write_text("(S (NP (DT the) (NN dog)) (VP (VBZ runs)))\n", encoding="utf-8")
    for split in ("train", "dev", "test"):  # a treebank in one-tree-per-line files
        shutil.copyfile(tree, inputs / f"{split}.trees")
    log.write_text("", encoding="utf-8")
    a = tiny_checkpoint(inputs / "a.pt", seed=1)
    b = tiny_checkpoint(inputs / "b.pt", seed=2)
    tiny_checkpoint(inputs / "checkpoint_1_10.pt", last_optimizer_state={"step": 10})
    name, template = CASES[case]
    argv = [arg.format(root=tmp_path, inputs=inputs, text=text, tree=tree, log=log, a=a, b=b)
            for arg in template]
    module = importlib.import_module(f"user_plugin.commands.{name}")
    before = snapshot(tmp_path)
    status = run_main(module.main, argv, module.PROG)
    line = one_error_line(capsys.readouterr().err)
    assert status == 1, line
    assert any(words in line for words in (
        "is also an input", "holds the input", "lies inside the input directory",
        "save directory of a training run")), line
    assert snapshot(tmp_path) == before


def test_averaging_into_its_save_directory_stays_allowed(tmp_path, capsys):
    """The paper's usage, ``--inputs SAVE_DIR --num-update-checkpoints N --output
    SAVE_DIR/checkpoint_avg.pt``, writes beside the checkpoints it reads."""
    average_checkpoints = importlib.import_module("user_plugin.commands.average_checkpoints")
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    for update in (10, 20):
        tiny_checkpoint(save_dir / f"checkpoint_1_{update}.pt", seed=update,
                        last_optimizer_state={"step": update})
    status = run_main(average_checkpoints.main,
                      ["--inputs", str(save_dir), "--num-update-checkpoints", "2", "--output",
                       str(save_dir / "checkpoint_avg.pt")], average_checkpoints.PROG)
    assert status == 0, capsys.readouterr().err
    assert "last_optimizer_state" not in torch.load(save_dir / "checkpoint_avg.pt",
                                                    weights_only=True)


def special_files(directory: Path) -> dict[str, Path]:
    """A named pipe, and as root a character device (the null device's numbers), in
    ``directory``: never the machine's own /dev nodes."""
    nodes = {"named pipe": directory / "fifo"}
    os.mkfifo(nodes["named pipe"])
    if os.geteuid() == 0:
        nodes["character device"] = directory / "null"
        os.mknod(nodes["character device"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return nodes


def test_an_output_onto_a_device_or_pipe_is_refused_and_the_node_stays(tmp_path, capsys):
    """As root, vaswani-score --output-json /dev/full replaced the device with a regular file,
    and vaswani-average --output DEVICE wrote a 2.7 MB regular file in its place: the one
    writer renamed over whatever the path named."""
    from user_plugin.commands import average_checkpoints, score_translation

    nodes = special_files(tmp_path)
    (tmp_path / "hyp").write_text("Ein Hund .\n", encoding="utf-8")
    (tmp_path / "ref").write_text("Ein Hund .\n", encoding="utf-8")
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    tiny_checkpoint(checkpoints / "checkpoint_1_10.pt")
    for kind, node in nodes.items():
        with pytest.raises(UserError, match=f"a {kind}, not a regular file"):
            atomic_write_text(node, "text")
        status = run_main(score_translation.main, [
            "--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref"), "--target-lang",
            "de", "--output-json", str(node)], score_translation.PROG)
        assert status == 1 and f"a {kind}" in one_error_line(capsys.readouterr().err)
        status = run_main(average_checkpoints.main, [
            "--inputs", str(checkpoints / "checkpoint_1_10.pt"), "--output", str(node)],
            average_checkpoints.PROG)
        assert status == 1 and f"a {kind}" in one_error_line(capsys.readouterr().err)
        mode = node.lstat().st_mode
        assert (stat.S_ISFIFO(mode) if kind == "named pipe" else stat.S_ISCHR(mode)), kind
