"""Python command lines run in child processes forked from one that has already imported the
libraries fairseq imports (torch, numpy, scipy, scikit-learn, hydra...), so that the suite's
hundreds of fairseq commands do not each spend 5 to 8 seconds importing them (a run of
``fairseq-generate --help`` takes 1 s instead of 8).

:func:`run` takes ``subprocess.run``'s place for the suite's Python commands. Each run is still
its own process, run as ``python -m MODULE``, ``python -c CODE`` or ``python SCRIPT`` would run
it: its own arguments, environment, working directory, ``sys.path`` (the working directory, ''
or the script's folder, then the interpreter's own entries), standard input, output and exit
status; the module, code or script executes as ``__main__``; an exception nothing caught goes
through ``sys.excepthook`` (our plugin's one-line errors included) and exits with status 1;
threads that are not daemons are joined and ``atexit`` handlers run, as at an interpreter's exit.
fairseq itself, its commands and our plugin are imported by the run, as in a new process: their
imports set up logging, register fairseq's components and patch it, in the command's order.
What differs: the other modules that :data:`COMMANDS` import are already imported (by
multiprocessing's ``forkserver``, started with one OpenMP thread), so what they would print
while importing is not printed. A command with interpreter options, uncaptured output or a
start-up variable of its own (:data:`STARTUP_VARIABLES`) runs as a new process.

Only the suite imports this module (tests/test_forked_cli.py compares it with new processes).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import locale
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

#: The commands whose imports the fork server makes (all but fairseq's and ours).
COMMANDS = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.interactive",
            "fairseq_cli.preprocess")
#: Set in the fork server's environment: the file listing the modules it imports.
PRELOAD_VARIABLE = "FORKED_CLI_PRELOAD"

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(["forked_cli"])


def _preload() -> None:
    """In the fork server: import the modules listed (those that fail to import stay out),
    and remove the listing."""
    listing = Path(os.environ.pop(PRELOAD_VARIABLE))
    names = json.loads(listing.read_text(encoding="utf-8"))
    listing.unlink()
    listing.parent.rmdir()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a module that imports only in its parent package's way
            continue


if os.environ.get(PRELOAD_VARIABLE):
    _preload()


def _child(argv: list, env: dict, cwd: str, base_path: list, stdin: str | None, out: str,
           err: str) -> None:
    """In the forked process: become ``python *argv`` and exit with its status."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in ((0, stdin, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_TRUNC),
                            (2, err, os.O_WRONLY | os.O_TRUNC)):
        if path is not None:
            handle = os.open(path, flags)
            os.dup2(handle, fd)
            os.close(handle)
    if stdin is not None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stdin)
    option, target, args = (argv[0], argv[1], argv[2:]) if argv[0] in ("-m", "-c") else (
        None, argv[0], argv[1:])
    first = {"-m": cwd, "-c": ""}.get(option, str(Path(target).resolve().parent))
    sys.path[:] = [first, *base_path]
    # as the interpreter sets it
    sys.argv = [{"-m": lambda: importlib.util.find_spec(target).origin, "-c": lambda: "-c"}.get(
        option, lambda: target)(), *args]
    status = 0
    try:
        if option == "-m":
            # a new process has the module as __main__ only, never under its own name; runpy's
            # function for ``python -m`` leaves sys.argv as the module leaves it
            sys.modules.pop(target, None)
            runpy._run_module_as_main(target)
        else:
            main = types.ModuleType("__main__")
            if option is None:
                main.__file__ = target
            sys.modules["__main__"] = main
            source = Path(target).read_bytes() if option is None else target
            exec(compile(source, "<string>" if option else target, "exec"), main.__dict__)
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            status = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            status = 1
    except BaseException:
        kind, error, frames = sys.exc_info()
        # the traceback a new process prints: from the command's own first frame
        while frames is not None and frames.tb_frame.f_code.co_filename in (
                __file__, "<frozen runpy>"):
            frames = frames.tb_next
        sys.excepthook(kind, error.with_traceback(frames), frames)
        status = 1
    try:
        # what the interpreter does at exit: join the threads that are not daemons (and run
        # their pools' exit hooks), then the atexit handlers
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


#: Variables read when the interpreter or torch starts: a run whose environment sets them
#: otherwise than the fork server's cannot be forked from it (PYTHONUNBUFFERED only sets how
#: the output is buffered, which a captured run does not see).
STARTUP_VARIABLES = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "CUDA", "LD_", "MALLOC", "LC_",
                     "LANG")
#: Start-up variables read only when a module is imported, by prefix: a server that has not
#: imported the module lets the run read them itself (importing inductor in the suite's own
#: process sets ``TORCHINDUCTOR_CACHE_DIR`` there).
READ_ON_IMPORT = {"TORCHINDUCTOR_": "torch._inductor.config"}
#: Where each decision of :func:`run` is appended (forked, or a new process and why), if set.
LOG_VARIABLE = "FORKED_CLI_LOG"

#: What a new process learns once for the fork server: the interpreter's own ``sys.path``, the
#: modules :data:`COMMANDS` import but fairseq's and ours, and the variables those imports set.
PROBE = """import json, os, sys
before = dict(os.environ)
for name in sys.argv[1:]:
    __import__(name)
ours = ("fairseq", "fairseq_cli", "user_plugin", "__main__", "__mp_main__")
print(json.dumps({"path": sys.path[1:],
                  "modules": [m for m in list(sys.modules) if m.split(".")[0] not in ours],
                  "set_by_imports": {k: v for k, v in os.environ.items() if before.get(k) != v}}))
"""


@dataclass
class _Server:
    """The fork server of this process: the environment it started with, what
    :data:`PROBE` found."""

    environment: dict
    path: list
    set_by_imports: dict
    modules: frozenset

    def startup_differences(self, env: Mapping[str, str]) -> set:
        """The start-up variables a new process with ``env`` would start with otherwise than
        the server did, but for those the preloaded imports set (to the same value) and those
        of modules the server has not imported."""
        unread = tuple(prefix for prefix, module in READ_ON_IMPORT.items()
                       if module not in self.modules)

        def startup(variables: Mapping[str, str]) -> set:
            return {(k, v) for k, v in variables.items()
                    if k.startswith(STARTUP_VARIABLES) and k != "PYTHONUNBUFFERED"
                    and not k.startswith(unread) and self.set_by_imports.get(k) != v}

        return {k for k, _ in startup(env) ^ startup(self.environment)}


_server: _Server | None = None


def _fork_server() -> _Server:
    """Start the fork server once (a probe process, then the server's imports: about 15 s)."""
    global _server
    if _server is None:
        # torch reads its thread count when it loads: one thread unless this process says
        environment = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        probe = subprocess.run([sys.executable, "-c", PROBE, *COMMANDS], env=environment,
                               capture_output=True, text=True, check=True)
        facts = json.loads(probe.stdout)
        listing = Path(tempfile.mkdtemp(prefix="forked-cli-")) / "preload.json"
        listing.write_text(json.dumps(facts["modules"]), encoding="utf-8")
        saved = dict(os.environ)
        # the server imports this module by name (multiprocessing gives it no sys.path)
        search = os.pathsep.join(filter(None, (str(Path(__file__).parent),
                                               environment.get("PYTHONPATH"))))
        os.environ.update(environment, PYTHONPATH=search, **{PRELOAD_VARIABLE: str(listing)})
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server = _Server(environment, facts["path"], facts["set_by_imports"],
                          frozenset(facts["modules"]))
    return _server


def _python_command(cmd: Sequence, kwargs: dict) -> bool:
    """Whether ``cmd`` is ``[sys.executable, -m MODULE | -c CODE | SCRIPT, ...]`` with no other
    interpreter option, its output captured and no argument but those :func:`run` takes."""
    if len(cmd) < 2 or str(cmd[0]) != sys.executable:
        return False
    first = str(cmd[1])
    if first.startswith("-") and (first not in ("-m", "-c") or len(cmd) < 3):
        return False
    return bool(kwargs.get("capture_output")) and not set(kwargs) - {
        "capture_output", "text", "cwd", "env", "input", "timeout", "check"}


def _why_new_process(cmd: Sequence, kwargs: dict) -> str | None:
    """Why ``cmd`` (run with ``kwargs``) must run as a new process; None if it can be forked."""
    if not _python_command(cmd, kwargs):
        return "not a captured python command"
    differences = _fork_server().startup_differences(kwargs.get("env") or os.environ)
    return f"start-up variables {sorted(differences)}" if differences else None


def forkable(cmd: Sequence, kwargs: dict) -> bool:
    """Whether :func:`run` forks ``cmd`` (run with ``kwargs``) from the fork server."""
    return _why_new_process(cmd, kwargs) is None


def run(cmd: Sequence, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)``, forked from the fork server where :func:`forkable`;
    a real new process otherwise. Each decision is appended to the file
    :data:`LOG_VARIABLE` names, if set."""
    why = _why_new_process(cmd, kwargs)
    if os.environ.get(LOG_VARIABLE):
        with open(os.environ[LOG_VARIABLE], "a", encoding="utf-8") as log:
            log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST"),
                                  "command": [str(c) for c in cmd[:3]],
                                  "decision": f"new process: {why}" if why else "forked"}) + "\n")
    if why:
        return subprocess.run(cmd, **kwargs)
    proc = _run_forked([str(c) for c in cmd[1:]], kwargs.get("env") or dict(os.environ),
                       cwd=kwargs.get("cwd"), timeout=kwargs.get("timeout"),
                       input=kwargs.get("input"), text=bool(kwargs.get("text")))
    if kwargs.get("check") and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc


def _run_forked(argv: Sequence[str], env: Mapping[str, str], cwd: Path | str | None,
                timeout: float | None, input: str | bytes | None,
                text: bool) -> subprocess.CompletedProcess:
    """Run ``python *argv`` (``-m MODULE ...``, ``-c CODE ...`` or ``SCRIPT ...``) in a forked
    child; its output (text or bytes), like ``subprocess.run(..., capture_output=True)``."""
    argv = [str(a) for a in argv]
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as scratch:
        out, err, stdin = Path(scratch, "stdout"), Path(scratch, "stderr"), None
        out.touch()
        err.touch()
        if input is not None:
            stdin = Path(scratch, "stdin")
            stdin.write_bytes(input.encode() if isinstance(input, str) else input)
        process = _context.Process(target=_child, args=(
            argv, dict(env), str(Path(cwd or os.getcwd()).resolve()), _fork_server().path,
            stdin and str(stdin), str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
        outputs = [out.read_bytes(), err.read_bytes()]
        if text:  # as text=True reads a pipe: the locale's encoding, universal newlines
            outputs = [o.decode(locale.getpreferredencoding(False)).replace(
                "\r\n", "\n").replace("\r", "\n") for o in outputs]
        return subprocess.CompletedProcess([sys.executable, *argv], process.exitcode, *outputs)
