"""A regular (non-editable) ``pip install .`` into a fresh virtual environment gives the
project's commands, and fairseq trains with ``--user-dir "$(vaswani-user-dir)"``.

The fresh environment is made offline: ``python -m venv``, a ``.pth`` file that lets it see this
environment's site-packages (pip, torch, sacremoses, ... : nothing is downloaded), the cached
fairseq-fixed wheel of ``scripts/build_fairseq.py`` installed into it (so that it has its own
``fairseq-train``), then ``pip install --no-index --no-build-isolation`` of a copy of the
package sources, with its dependencies checked against what is visible. Every command runs
outside the repository, so that nothing but the installed copy of ``user_plugin`` can be
imported. About a minute on 2 cores; not part of the fast subset.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import forked_cli
import pytest
from cli import REPO

FAIRSEQ_FIXED_VERSION = "0.12.3.1"
TINY_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings",
]


def cached_fairseq_wheel() -> Path:
    """The fairseq-fixed wheel that ``scripts/setup_venv.sh`` built for this Python."""
    if sys.version_info < (3, 11):
        pytest.skip("Python < 3.11 installs the official fairseq, not the cached fairseq-fixed")
    cache = Path(os.environ.get("VASWANI_CACHE") or Path.home() / ".cache" / "vaswani")
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheels = sorted((cache / "wheels").glob(
        f"fairseq_fixed-{FAIRSEQ_FIXED_VERSION}-{tag}-{tag}-*.whl"))
    if not wheels:
        pytest.skip(f"no cached fairseq-fixed wheel for {tag} in {cache / 'wheels'}: "
                    "run scripts/setup_venv.sh first")
    return wheels[-1]


def clean_env() -> dict:
    """This process's environment without anything that would put the repository on the path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(cmd, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd`` (outside the repository); raise with its output if it fails."""
    proc = forked_cli.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                             f"--- stdout ---\n{proc.stdout[-3000:]}\n"
                             f"--- stderr ---\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> SimpleNamespace:
    """A fresh virtual environment with the package installed from a copy of its sources."""
    wheel = cached_fairseq_wheel()
    root = tmp_path_factory.mktemp("installed commands")  # a space in every path
    venv = root / "venv"
    # pip and setuptools come from the outer environment too (its setuptools is the one that
    # satisfies torch's requirement; ensurepip's may be older).
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    venv_site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         cwd=root).stdout.strip())
    (venv_site / "outer_environment.pth").write_text(
        "".join(f"{path}\n" for path in site.getsitepackages()), encoding="utf-8")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index"]
    run([*pip, "--no-deps", "--ignore-installed", wheel], cwd=root)
    source = root / "source"
    source.mkdir()
    shutil.copy2(REPO / "setup.py", source / "setup.py")
    shutil.copytree(REPO / "user_plugin", source / "user_plugin",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    run([*pip, "--no-build-isolation", source], cwd=root)
    work = root / "work"
    work.mkdir()
    return SimpleNamespace(root=root, venv=venv, bin=venv / "bin", python=python,
                           site=venv_site.resolve(), work=work)


def test_the_user_dir_command_prints_the_installed_package(installed):
    printed = run([installed.bin / "vaswani-user-dir"], cwd=installed.work).stdout.strip()
    user_dir = Path(printed)
    assert user_dir == installed.site / "user_plugin"
    assert (user_dir / "__init__.py").is_file() and (user_dir / "models").is_dir()
    assert REPO not in user_dir.parents
    as_module = run([installed.python, "-m", "user_plugin"], cwd=installed.work).stdout.strip()
    assert as_module == printed


def test_every_command_is_installed_and_loads(installed):
    code = ("import json; from importlib.metadata import distribution; "
            "eps = [e for e in distribution('vaswani').entry_points "
            "if e.group == 'console_scripts']; "
            "print(json.dumps({e.name: getattr(e.load(), '__module__', '') for e in eps}))")
    loaded = json.loads(run([installed.python, "-c", code], cwd=installed.work).stdout)
    for name in ("vaswani-user-dir", "vaswani-plot-training", "vaswani-plot-attention",
                 "vaswani-ablation-table", "vaswani-prepare-trees", "vaswani-parse-eval",
                 "vaswani-options", "vaswani-export", "vaswani-translate", "vaswani-average",
                 "vaswani-score", "vaswani-prepare-text", "vaswani-serve"):
        assert name in loaded, name
    for name, module in loaded.items():
        assert (installed.bin / name).is_file(), name
        assert module.startswith("user_plugin."), (name, module)
    help_text = run([installed.bin / "vaswani-parse-eval", "--help"], cwd=installed.work).stdout
    assert help_text.startswith("usage: vaswani-parse-eval") and "--gold" in help_text
    # vaswani-serve's page is package data: installed beside its code
    static = installed.site / "user_plugin" / "serving" / "static"
    assert {p.name for p in static.iterdir()} >= {"index.html", "page.js", "page.css"}
    help_text = run([installed.bin / "vaswani-serve", "--help"], cwd=installed.work).stdout
    assert help_text.startswith("usage: vaswani-serve") and "--max-queue" in help_text


def test_fairseq_trains_with_the_printed_user_dir(installed):
    text = installed.root / "text"
    text.mkdir()
    words_en = "one two three four five six seven eight".split()
    words_de = "eins zwei drei vier fünf sechs sieben acht".split()
    for split, count in (("train", 48), ("valid", 8)):
        pairs = [[(i * 3 + j) % len(words_en) for j in range(2 + i % 4)] for i in range(count)]
        (text / f"{split}.en").write_text(
            "".join(" ".join(words_en[k] for k in p) + "\n" for p in pairs), encoding="utf-8")
        (text / f"{split}.de").write_text(
            "".join(" ".join(words_de[k] for k in p) + "\n" for p in pairs), encoding="utf-8")
    data_bin = installed.root / "data-bin"
    run([installed.bin / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--joined-dictionary", "--trainpref", text / "train", "--validpref", text / "valid",
         "--destdir", data_bin, "--workers", "1"], cwd=installed.work)
    user_dir = run([installed.bin / "vaswani-user-dir"], cwd=installed.work).stdout.strip()
    save_dir = installed.root / "checkpoints"
    proc = run([installed.bin / "fairseq-train", data_bin, "--user-dir", user_dir,
                "--arch", "vaswani_base", *TINY_MODEL, "--task", "vaswani_translation",
                "--criterion", "vaswani_label_smoothed_cross_entropy",
                "--label-smoothing", "0.1", "--optimizer", "adam", "--lr", "1",
                "--lr-scheduler", "vaswani_inverse_sqrt", "--warmup-updates", "4",
                "--max-tokens", "200", "--max-update", "3", "--cpu", "--num-workers", "0",
                "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation",
                "--log-format", "simple", "--log-interval", "1"], cwd=installed.work)
    log = proc.stdout + proc.stderr
    assert (save_dir / "checkpoint_last.pt").is_file()
    assert "VaswaniTransformerModel" in log
    updates = [int(n) for n in re.findall(r"num_updates=(\d+)", log)]
    assert updates and max(updates) == 3
    assert f"'user_dir': '{user_dir}'" in log
