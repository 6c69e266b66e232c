"""The doors the user's shell sets up rather than the command: a closed standard input, a
reader of standard output that goes away (a pipe into ``head``), an output encoding that cannot
hold German (``PYTHONIOENCODING=ascii``), at our commands and at fairseq's commands running our
task (:mod:`user_plugin.files.standard_streams`); and the other doors' limits, each refused in
one line naming the option or path at fault before the work: ``vaswani-plot-attention``'s
sentence length, ``--dpi`` and output under a regular file, ``fairseq-train``'s
``--max-tokens 0`` and a save directory of another ``--arch``.

The matrix of cases is docs/faults.md ("Fourth round").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import forked_cli
from cli import REPO, USER_DIR, command, fairseq_env
from test_fault_classes import error_line, run_cli, train_into

from user_plugin.files.standard_streams import BROKEN_PIPE_STATUS

SENTENCES = "A man rides a bike.\nTwo dogs play in the snow.\n"


def run(module: str, *args, stdin: str | None = SENTENCES, close_stdin: bool = False,
        stdout=subprocess.PIPE, **env) -> subprocess.CompletedProcess:
    """Our command ``module``; ``close_stdin``: run with file descriptor 0 closed (``<&-``)."""
    argv = [*command(module), *map(str, args)]
    if close_stdin:
        argv, stdin = ["bash", "-c", 'exec "$@" <&-', "bash", *argv], None
    return forked_cli.run(argv, input=stdin, text=True, stdout=stdout, stderr=subprocess.PIPE,
                          env={**fairseq_env(), **env}, timeout=600, check=False)


def one_line(proc: subprocess.CompletedProcess, prog: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    return lines[0]


def closed_pipe() -> int:
    """The writing end of a pipe whose reader is already gone."""
    reader, writer = os.pipe()
    os.close(reader)
    return writer


def test_a_closed_standard_input_is_one_line_before_the_model_loads(packaged_tiny_model):
    proc = run("translate", packaged_tiny_model.package, close_stdin=True)
    assert one_line(proc, "vaswani-translate") == (
        "vaswani-translate: error: standard input is closed: give the sentences on standard "
        "input, one per line (from a file or a pipe)")


def test_a_reader_gone_ends_our_command_quietly(packaged_tiny_model):
    """``vaswani-translate ... | head``: before, 'standard output: cannot write (broken pipe)'
    where conventional tools end without a word."""
    writer = closed_pipe()
    try:
        proc = run("translate", packaged_tiny_model.package, stdout=writer)
    finally:
        os.close(writer)
    assert (proc.returncode, proc.stderr) == (BROKEN_PIPE_STATUS, "")


def test_an_output_encoding_without_the_text_is_one_line_naming_it(packaged_tiny_model):
    """The package's path holds 'ü', which ``--check`` prints; before: a UnicodeEncodeError
    traceback (and the translator's own errors wrapped it as a ValueError's text)."""
    proc = run("package", "--check", packaged_tiny_model.package, PYTHONIOENCODING="ascii")
    line = one_line(proc, "vaswani-package")
    assert line.startswith("vaswani-package: error: standard output's encoding, ascii, cannot "
                           "write '\\xfc': set PYTHONIOENCODING=utf-8"), line


def generate_argv(model) -> list[str]:
    """``fairseq-generate`` of our task on the model's test split (German references)."""
    return [sys.executable, "-m", "fairseq_cli.generate", str(model.data_bin), "--user-dir",
            USER_DIR, "--task", "vaswani_translation", "--path", str(model.checkpoint), "--cpu",
            "--beam", "2", "--gen-subset", "test", "--max-tokens", "4000"]


def test_fairseqs_generate_of_our_task_into_a_gone_reader_or_ascii_has_no_traceback(
        packaged_tiny_model):
    """The German references (``T-`` lines) under ``PYTHONIOENCODING=ascii``, and the output
    piped into a reader that is gone: before, a UnicodeEncodeError and a BrokenPipeError
    traceback."""
    argv = generate_argv(packaged_tiny_model)
    proc = forked_cli.run(argv, cwd=REPO, env={**fairseq_env(), "PYTHONIOENCODING": "ascii"},
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 1 and "standard output's encoding, ascii, cannot write" in \
        error_line(proc.stderr)
    writer = closed_pipe()
    try:
        proc = forked_cli.run(argv, cwd=REPO, env=fairseq_env(), stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=600, check=False)
    finally:
        os.close(writer)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and \
        ": error: " not in proc.stderr, proc.stderr[-3000:]


def test_plot_attention_refuses_what_it_cannot_draw_in_one_line_naming_it(packaged_tiny_model,
                                                                          tmp_path):
    """Before: a matplotlib ValueError traceback for ``--dpi 0`` and for a figure wider than a
    PNG may be, and the translator's ValueError traceback for a 2,000-token source."""
    package = packaged_tiny_model.package
    base = ["--model-dir", package, "--out-dir", tmp_path / "out"]
    proc = run("plot_attention", *base, "--source", "a dog", "--dpi", "0")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "vaswani-plot-attention: error: argument --dpi: must be from 1 to 1200, got 0")
    line = one_line(run("plot_attention", *base, "--source", " ".join(["dog"] * 2000)),
                    "vaswani-plot-attention")
    assert "--source has 2001 model tokens (with EOS); the heatmaps draw sentences of at most " \
        "200" in line
    line = one_line(run("plot_attention", *base, "--source", "a dog", "--target",
                        " ".join(["Hund"] * 150), "--dpi", "1200"), "vaswani-plot-attention")
    assert "--dpi 1200 makes a figure" in line and "give --dpi" in line
    (tmp_path / "a file").write_text("kept\n", encoding="utf-8")
    line = one_line(run("plot_attention", "--model-dir", package, "--source", "a dog",
                        "--out-dir", tmp_path / "a file" / "out"), "vaswani-plot-attention")
    assert line.endswith(f"{tmp_path / 'a file'} is not a directory (nothing was written)")
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "a file").read_text(encoding="utf-8") == "kept\n"


def test_fairseq_train_refuses_a_batch_limit_of_zero_in_one_line(trained_multi30k, tmp_path):
    """Before: an IndexError traceback from fairseq's batch_by_size."""
    args = train_into(trained_multi30k, tmp_path / "checkpoints")
    args[args.index("--max-tokens") + 1] = "0"
    proc = run_cli("train", args)
    assert proc.returncode == 1 and error_line(proc.stderr).endswith(
        "error: --max-tokens (or --max-tokens-valid) must be at least 1, or unset for no "
        "limit; got 0")
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_resuming_our_save_directory_with_another_arch_names_the_arch(trained_multi30k,
                                                                      tmp_path):
    """``--arch transformer`` on a ``vaswani_base`` save directory (a stock run, so fairseq's
    own resume): before, the line blamed architecture options such as
    --encoder-normalize-before."""
    save_dir = tmp_path / "checkpoints"
    shutil.copytree(trained_multi30k.checkpoint_dir, save_dir,
                    ignore=shutil.ignore_patterns("*.lock"))
    args = train_into(trained_multi30k, save_dir)
    args[args.index("--arch") + 1] = "transformer"
    proc = run_cli("train", args)
    line = error_line(proc.stderr)
    assert proc.returncode == 1
    assert f"{save_dir / 'checkpoint_last.pt'}: was trained with --arch vaswani_base" in line
    assert "give --arch vaswani_base and the architecture options" in line
