"""scripts/setup_venv.sh decides from its stamp whether an environment is up to date: the test
suite's extras satisfy the demo's plain set-up, not the other way round. A stand-in Python runs
the real interpreter but refuses pip, so a decision to install shows without installing."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from cli import REPO

TORCH_SPEC = "torch==2.13.0"


def make_venv(tmp_path: Path, extras_line: str | None) -> Path:
    """A directory laid out as a virtualenv whose python is this one except for ``-m pip``,
    with a stamp for this checkout and ``extras_line`` (no stamp when None)."""
    venv = tmp_path / "venv with space é"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "pip was called" >&2; exit 7; fi\n'
        f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    if extras_line is not None:
        sources = b"".join((REPO / name).read_bytes() for name in
                           ("setup.py", "scripts/setup_venv.sh", "scripts/build_fairseq.py"))
        want = f"{hashlib.sha256(sources).hexdigest()[:16]} {TORCH_SPEC}"
        (venv / ".vaswani-installed").write_text(f"{want}\n{extras_line}\n")
    return venv


def setup(venv: Path, extras: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EXTRAS"}
    env.update(VENV=str(venv), TORCH_SPEC=TORCH_SPEC, PYTHONPATH=str(REPO))
    if extras is not None:
        env["EXTRAS"] = extras
    return forked_cli.run(["bash", str(REPO / "scripts" / "setup_venv.sh")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("installed, asked, up_to_date", [
    ("extras test", None, True),    # the suite's set-up, asked again
    ("extras test", "", True),      # the demo's plain set-up after the suite's
    ("extras ", "", True),          # the demo's, again
    ("extras ", None, False),       # the suite after the demo: the test tools are missing
    ("", "", True),                 # a stamp without its extras line: an older set-up's,
    ("", None, False),              # up to date only for what it surely installed
])
def test_the_stamp_says_which_extras_are_installed(tmp_path, installed, asked, up_to_date):
    proc = setup(make_venv(tmp_path, installed), asked)
    if up_to_date:
        assert proc.returncode == 0, proc.stderr
        assert "is up to date" in proc.stdout
    else:
        assert proc.returncode == 7 and "pip was called" in proc.stderr
        assert "is up to date" not in proc.stdout


def test_an_unknown_extra_is_one_error_line(tmp_path):
    proc = setup(make_venv(tmp_path, "extras test"), "gpu")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "[setup] error: EXTRAS must be 'test' or empty, got 'gpu'"
