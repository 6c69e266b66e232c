"""One line at every entry point: the plugin's own option checks inside ``fairseq-train``,
``--fp16`` on a CPU, a full disk under a library's writer, an interrupt (Ctrl-C) in our
commands and in fairseq's with the plugin loaded; and the exception hook, which turns only the
errors the plugin recognises into one line.

The matrix of cases, outcomes and tests is docs/faults.md ("One line at every entry point").
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import forked_cli
import pytest
from cli import REPO, fairseq_env
from test_fault_classes import error_line, one_error_line, run_cli, tiny_checkpoint, train_into
from test_faults import tmpfs_available

from user_plugin.commands import average_checkpoints
from user_plugin.files import errors, run_main
from user_plugin.files.errors import INTERRUPTED, os_error_of


@pytest.mark.parametrize("option, value, words", [
    ("--label-smoothing", "1.5", "--label-smoothing must be in [0, 1), got 1.5"),
    ("--warmup-updates", "-5", "--warmup-updates must be at least 1, got -5"),
    ("--lr-scale", "0", "--lr-scale must be a positive finite number, got 0.0"),
])
def test_the_plugins_option_checks_are_one_line_in_fairseq_train(option, value, words,
                                                                  trained_multi30k, tmp_path):
    """Before: a ValueError traceback of 53 to 145 lines (the criterion's, the scheduler's and
    the model's checks raise while fairseq-train builds them)."""
    save_dir = tmp_path / "checkpoints"
    extra = [option] if value is None else [option, value]
    proc = run_cli("train", train_into(trained_multi30k, save_dir, *extra))
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and line.startswith(f"train.py: error: {words}"), line
    assert not list(save_dir.glob("*.pt"))


@pytest.mark.parametrize("tool, args, words", [
    ("generate", [], "--path required for generation"),
    ("interactive", ["--path", "model.pt", "--batch-size", "16", "--buffer-size", "8"],
     "--batch-size cannot be larger than --buffer-size"),
    ("generate", ["--path", "model.pt", "--sampling", "--nbest", "2"],
     "--sampling requires --nbest to be equal to --beam"),
])
def test_the_usage_checks_of_fairseqs_commands_are_one_line(tool, args, words, tmp_path):
    """fairseq's commands check some options with an ``assert`` in their own code: before, a
    traceback ending in ``AssertionError: --path required for generation!``."""
    proc = run_cli(tool, [tmp_path, "--user-dir", REPO / "user_plugin", "--task",
                          "vaswani_translation", *args])
    assert proc.returncode == 1
    assert error_line(proc.stderr) == f"{tool}.py: error: {words}"


def test_fp16_of_fairseqs_own_trainer_on_a_cpu_is_one_line(trained_multi30k, tmp_path):
    """A stock ``--arch transformer`` run in a process that loaded the plugin keeps fairseq's
    ``--fp16`` (the plugin's float32 masters are for its own runs, which train on a CPU), and
    fairseq's trainer needs CUDA for it: before, a 147-line ``AssertionError: Torch not
    compiled with CUDA enabled`` at the first update; now one line naming what works."""
    save_dir = tmp_path / "checkpoints"
    args = train_into(trained_multi30k, save_dir, "--fp16")
    args[args.index("--arch") + 1] = "transformer"
    proc = run_cli("train", args)
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and line.startswith(
        "train.py: error: --fp16 of fairseq's own trainer needs a CUDA GPU"), line
    assert "--memory-efficient-fp16" in line and "--arch vaswani_*" in line
    assert not list(save_dir.glob("*.pt"))


def test_a_full_disk_under_the_transformers_export_is_one_line(trained_multi30k, tmp_path):
    """safetensors reports a full disk as its own error (before: a traceback); the export
    directory is staged beside the output, so nothing is left on the disk."""
    if not tmpfs_available():
        pytest.skip("cannot mount a tmpfs here (no unprivileged user namespaces)")
    disk = tmp_path / "disk"
    disk.mkdir()
    export = [sys.executable, "-m", "user_plugin.export",
              str(trained_multi30k.checkpoint_dir / "checkpoint_last.pt"), "--data-dir",
              str(trained_multi30k.data_bin), "--to", "transformers", "--output",
              str(disk / "hf")]
    script = (f"mount -t tmpfs -o size=256k tmpfs {disk} && cd {shlex.quote(str(REPO))} && "
              f"{shlex.join(export)}; status=$?; ls -A {disk}; exit $status")
    proc = forked_cli.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                          text=True, env=fairseq_env(), timeout=600, check=False)
    lines = [line for line in proc.stderr.splitlines()
             if not line.startswith(("exporting ", "WARNING: no text_pipeline.json"))]
    assert proc.returncode == 1
    assert one_error_line("\n".join(lines)) == \
        f"vaswani-export: error: {disk / 'hf'}: cannot write (no space left on device)"
    assert proc.stdout == ""  # ls -A of the disk: nothing left behind


def test_the_os_error_behind_a_library_error_is_found():
    class SafetensorError(Exception):
        pass

    error = SafetensorError("Error while serializing: I/O error: No space left on device "
                            "(os error 28)")
    assert os_error_of(error).errno == 28
    try:
        try:
            raise PermissionError(13, "Permission denied")
        except OSError as inner:
            raise RuntimeError("file write failed") from inner
    except RuntimeError as outer:
        assert os_error_of(outer).errno == 13
    assert os_error_of(ValueError("a value")) is None
    assert os_error_of(errors.UserError("x (os error 28)")) is None


# --------------------------------------------------------------------------------------------
# Interrupts


def test_an_interrupt_in_our_commands_is_one_line_saying_what_was_left(tmp_path, capsys,
                                                                      monkeypatch):
    a = tiny_checkpoint(tmp_path / "a.pt", seed=1)
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2)

    def interrupted(paths):
        raise KeyboardInterrupt

    monkeypatch.setattr(errors, "_written", [])  # this process's writes: none yet
    monkeypatch.setattr(average_checkpoints, "average_checkpoints", interrupted)
    argv = ["--inputs", str(a), str(b), "--output", str(tmp_path / "avg.pt")]
    status = run_main(average_checkpoints.main, argv, average_checkpoints.PROG)
    err = capsys.readouterr().err
    assert status == INTERRUPTED == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == \
        "vaswani-average: interrupted: no file was written or changed"
    assert not (tmp_path / "avg.pt").exists()

    def one_written_then_interrupted(argv):
        errors.note_written(tmp_path / "first.txt")
        raise KeyboardInterrupt

    status = run_main(one_written_then_interrupted, [], "tool")
    assert status == 130 and capsys.readouterr().err.startswith(
        f"tool: interrupted: 1 file(s) were written whole before it (the last: "
        f"{tmp_path / 'first.txt'})")


def test_the_exception_hook_turns_only_what_the_plugin_recognises_into_one_line(tmp_path):
    """A UserError (and so InvalidValue) and an interrupt are one line; any other error keeps
    its traceback, even a ValueError."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = tmp_path / "tool.py"
    header = "import user_plugin.commands  # the table's one_line_errors row\n" \
             "from user_plugin.files import InvalidValue\n"
    for body, status, expected in [
        ("raise InvalidValue('--beam must be >= 1, got 0')", 1,
         "tool.py: error: --beam must be >= 1, got 0\n"),
        ("raise KeyboardInterrupt", -signal.SIGINT,
         "tool.py: interrupted: no file was written or changed\n"),
        ("raise ValueError('a bug must stay visible')", 1, None),
    ]:
        script.write_text(header + body + "\n", encoding="utf-8")
        proc = forked_cli.run([sys.executable, str(script)], capture_output=True, text=True,
                              env=env, check=False)
        assert proc.returncode == status, proc.stderr
        if expected is None:
            assert "Traceback" in proc.stderr and "ValueError: a bug" in proc.stderr
        else:
            assert proc.stderr == expected


def test_an_interrupted_training_says_which_checkpoint_a_rerun_resumes_from(trained_multi30k,
                                                                           tmp_path):
    """Ctrl-C (SIGINT) in a real fairseq-train once a checkpoint is saved (before: a
    KeyboardInterrupt traceback): one line naming the last checkpoint and its update, which is
    intact; the interpreter ends by SIGINT, as the shell expects (status 130)."""
    from user_plugin.artifacts.checkpoints import checkpoint_file_problem
    from user_plugin.fairseq_patches.save_directory import num_updates, read_metadata

    save_dir = tmp_path / "checkpoints"
    args = train_into(trained_multi30k, save_dir)
    args[args.index("--max-update") + 1] = "100000"
    # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background (`cmd &` in a
    # shell without job control) has SIGINT ignored, which every child would inherit.
    # -X faulthandler: if the interrupt is not answered, SIGABRT makes the process print every
    # thread's stack, so that the failure says where it was.
    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "fairseq_cli.train",
                                *map(str, args)], cwd=REPO, env=fairseq_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not (save_dir / "checkpoint_last.pt").exists() and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint saved in 300 s"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=60)
            pytest.fail(f"SIGINT unanswered for 120 s; the stacks at SIGABRT:\n{stderr[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGINT and "Traceback" not in stderr, stderr[-3000:]
    last = save_dir / "checkpoint_last.pt"
    updates = num_updates(read_metadata(last))
    assert stderr.strip().splitlines()[-1] == (
        f"train.py: interrupted: the last checkpoint saved is {last} (update {updates}), "
        "intact: rerun the same command to resume from it")
    assert checkpoint_file_problem(last) is None and updates >= 20
