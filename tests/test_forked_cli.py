"""The suite's forked command lines (:mod:`forked_cli`) give what a new process gives: the same
exit status, output and error output as ``subprocess.run`` for the same command, through every
way a command ends and every input it reads."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from cli import PAPER_OPTIMIZATION_ARGS, TINY_MODEL_ARGS, USER_DIR, fairseq_env

SCRIPT = """\
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran"))
def late():
    time.sleep(0.2)
    print("thread finished")
threading.Thread(target=late).start()
print("args", sys.argv[1:], "first path", sys.path[0].endswith("scripts dir"))
print("stdin", sys.stdin.read().strip())
if sys.argv[1:] == ["fail"]:
    raise ValueError("bad value")
if sys.argv[1:] == ["hook"]:  # what fairseq's wrappers and our one-line hook do
    sys.argv = ["renamed-tool"]
    sys.excepthook = lambda kind, error, frames: print(f"{sys.argv[0]}: error: {error}",
                                                       file=sys.stderr)
    raise ValueError("bad value")
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("forked") / "scripts dir" / "probe ü.py"
    path.parent.mkdir()
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def server_env(**extra: str) -> dict:
    """The fork server's environment (this worker's own may have gained start-up variables from
    other tests since), with ``extra``."""
    return {**forked_cli._fork_server().environment, **extra}


def both(cmd: list, **kwargs) -> tuple:
    kwargs = {"capture_output": True, "text": True, "timeout": 300, "env": server_env(),
              **kwargs}
    assert forked_cli.forkable(cmd, kwargs)
    return forked_cli.run(cmd, **kwargs), subprocess.run(cmd, **kwargs)


def assert_same(forked: subprocess.CompletedProcess, real: subprocess.CompletedProcess) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        real.returncode, real.stdout, real.stderr)


@pytest.mark.parametrize("args", [[], ["3"], ["fail"], ["hook"]])
def test_a_script_ends_as_in_a_new_process(script, args, tmp_path):
    forked, real = both([sys.executable, str(script), *args], input="from stdin\n",
                        cwd=tmp_path)
    assert_same(forked, real)
    assert "thread finished" in real.stdout and "atexit ran" in real.stdout
    if args == ["fail"]:
        assert real.returncode == 1 and "ValueError: bad value" in real.stderr
    if args == ["hook"]:
        assert real.returncode == 1 and real.stderr == "renamed-tool: error: bad value\n"


def test_code_and_modules_see_their_arguments_directory_and_environment(tmp_path):
    code = "import os, sys; print(sys.argv, repr(sys.path[0]), os.getcwd(), os.environ['PROBE'])"
    env = server_env(PROBE="ü value")
    assert_same(*both([sys.executable, "-c", code, "a b"], cwd=tmp_path, env=env))
    (tmp_path / "probe_module.py").write_text(
        "import sys; print(sys.argv[1:], __name__); sys.exit('exit message')\n")
    forked, real = both([sys.executable, "-m", "probe_module", "x"], cwd=tmp_path)
    assert_same(forked, real)
    assert real.returncode == 1 and real.stderr == "exit message\n"


def test_our_one_line_errors_and_fairseqs_usage_errors_read_the_same():
    missing_data = [sys.executable, "-m", "fairseq_cli.generate", "--user-dir", USER_DIR,
                    "--task", "vaswani_translation", "/nonexistent", "--path", "/none.pt"]
    forked, real = both(missing_data, env=server_env(PYTHONUNBUFFERED="1"))
    assert_same(forked, real)
    assert real.returncode == 1 and real.stderr.strip().splitlines()[-1] == (
        "generate.py: error: /nonexistent: no such file or directory")
    usage = [sys.executable, "-m", "fairseq_cli.generate", "--beam", "x"]
    forked, real = both(usage, env=server_env(PYTHONUNBUFFERED="1"))
    assert_same(forked, real)
    assert real.returncode == 2 and "invalid int value: 'x'" in real.stderr


def test_what_cannot_be_forked_runs_as_a_new_process():
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    code = "import torch; print(torch.get_num_threads())"
    assert not forked_cli.forkable([sys.executable, "-c", code],
                                    {"capture_output": True, "env": env})
    assert not forked_cli.forkable([sys.executable, "-X", "faulthandler", "-c", code],
                                    {"capture_output": True})
    assert not forked_cli.forkable(["bash", "-c", "true"], {"capture_output": True})
    proc = forked_cli.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    assert proc.stdout.strip() == "2"


def masked(text: str) -> list:
    """Lines with every digit masked: times, speeds and dates differ between two runs."""
    return [re.sub(r"\d+(\.\d+)?", "0", line) for line in text.splitlines()]


def test_a_training_logs_the_same_lines_to_the_same_streams(multi30k_bin, tmp_path):
    """fairseq-train sets up logging when its module loads: a forked run logs to standard output
    as a new process does, the same lines, and writes a checkpoint that loads the same."""
    runs = []
    for name in ("forked", "real"):
        args = [sys.executable, "-m", "fairseq_cli.train", multi30k_bin.data_bin, "--user-dir",
                USER_DIR, "--cpu", *TINY_MODEL_ARGS, *PAPER_OPTIMIZATION_ARGS,
                "--warmup-updates", "4", "--max-tokens", "1000", "--max-update", "3",
                "--save-dir", tmp_path / name, "--no-epoch-checkpoints", "--num-workers", "0",
                "--log-interval", "1", "--seed", "1"]
        run = forked_cli.run if name == "forked" else subprocess.run
        proc = run([str(a) for a in args], env=fairseq_env(), capture_output=True, text=True,
                   timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(proc)
    forked, real = runs
    assert "| train_inner |" in real.stdout and "done training" in real.stdout
    assert masked(forked.stdout.replace(str(tmp_path / "forked"), "SAVE")) == masked(
        real.stdout.replace(str(tmp_path / "real"), "SAVE"))
    assert masked(forked.stderr) == masked(real.stderr)


def test_variables_that_imports_set_in_this_process_keep_forking():
    """Importing torch, scikit-learn... sets some start-up variables (``KMP_*``) in this
    process's environment, after the server started: what those imports set is no difference,
    another value is."""
    for name in forked_cli.COMMANDS:
        __import__(name)
    cmd = [sys.executable, "-c", "pass"]
    server = forked_cli._fork_server()
    assert forked_cli.forkable(cmd, {"capture_output": True,
                                     "env": {**server.environment, **server.set_by_imports}})
    for name, value in server.set_by_imports.items():
        if name.startswith(forked_cli.STARTUP_VARIABLES):
            changed = {**server.environment, name: value + "0"}
            assert not forked_cli.forkable(cmd, {"capture_output": True, "env": changed})


def test_the_libraries_are_imported_once_and_fairseq_by_each_run(tmp_path):
    """From any working directory: the server has imported torch, not fairseq or our plugin."""
    code = ("import sys; print(*(name in sys.modules for name in "
            "('torch', 'sklearn', 'fairseq', 'fairseq_cli', 'user_plugin')))")
    proc = forked_cli.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, check=True, env=server_env())
    assert proc.stdout.split() == ["True", "True", "False", "False", "False"]


def test_inductors_variables_are_read_by_the_run_where_the_server_has_not_imported_it(tmp_path):
    """Importing inductor in the suite's process sets ``TORCHINDUCTOR_CACHE_DIR`` there: the
    server has not imported inductor, so a run given the variable reads it itself; a server
    that had imported it could not fork that run."""
    cmd = [sys.executable, "-c", "from torch._inductor.runtime.cache_dir_utils import "
           "cache_dir; print(cache_dir())"]
    forked, real = both(cmd, env=server_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ü cache")))
    assert_same(forked, real)
    assert forked.stdout.strip() == str(tmp_path / "ü cache")
    server = forked_cli._fork_server()
    assert "torch._inductor.config" not in server.modules
    imported = dataclasses.replace(server, modules=server.modules | {"torch._inductor.config"})
    assert imported.startup_differences(
        server_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path))) == {"TORCHINDUCTOR_CACHE_DIR"}
