#!/usr/bin/env python
"""Make the folder that travels to the GPU machine with the GPU check (``.gpu_carry/``).

The GPU machine has Python 3.12 with torch and CUDA, and no network. What it lacks for the check
is built or fetched here, once:

* ``wheels/``: fairseq-fixed for CPython 3.12 with the three extensions fairseq's text CLIs use
  (``scripts/build_fairseq.py``, the builder ``scripts/setup_venv.sh`` uses too), and the
  dependencies missing there, as CPython 3.12 wheels: hydra-core, omegaconf, antlr4 (built here:
  it has no wheel), bitarray, sacremoses;
* ``data/multi30k/``: Multi30k EN-DE prepared and binarized by the recipes' own prepare and
  binarize steps (Moses, BPE with 8,000 merges, joined dictionary: the demo's data), with the raw
  test reference for sacreBLEU;
* ``data/wmt14_length_pairs.json``: the (source, target) lengths of newstest2014 EN-DE in BPE
  tokens (``user_plugin/measurement/synthetic_corpus.py``), from which the speed section makes
  its corpus on the GPU machine;
* ``manifest.json``: the sha256 of every carried file. The check verifies it before it uses
  anything.

Idempotent: a second run re-checks every file against the manifest and rebuilds nothing that
matches. Usage (from the repository root, with the project's ``.venv``)::

    .venv/bin/python scripts/gpu_check/build_carry.py            # makes .gpu_carry/
    .venv/bin/python scripts/gpu_check/build_carry.py --check    # verifies it only

Environment: ``PYTHON312`` (a CPython 3.12 interpreter; default: ``python3.12`` on PATH or
pyenv's), ``VASWANI_CACHE`` (the builder's cache), ``VASWANI_SHARED_DATA`` (default
``../shared/data``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / ".gpu_carry"
#: CPython 3.12 wheels the GPU machine lacks (versions as in the project's .venv).
WHEELS = ["hydra-core==1.3.2", "omegaconf==2.3.0", "bitarray==3.12.3", "sacremoses==0.2.0"]
#: No wheel exists for it: built here (pure Python, so it serves any CPython 3).
SOURCE_ONLY = ["antlr4-python3-runtime==4.9.3"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
BPE_OPS = 8000
#: ``--tiny`` (the CPU dry run of the check): lines kept per split, BPE merges; no wheels.
TINY_LINES = {"train": 1500, "valid": 60, "test": 30}
TINY_BPE_OPS = 300
MAX_BYTES = 48 * 2**20  # the device tool carries 64 MiB with the working tree


class CarryError(Exception):
    """One line for the user."""


def log(message: str) -> None:
    print(f"[build_carry] {message}", flush=True)


def sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def run(command: List[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise CarryError(f"{' '.join(map(str, command[:4]))} ... failed: {tail}")
    return result


def find_python312() -> str:
    candidates = [os.environ.get("PYTHON312")]
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(Path(root, "versions").glob("3.12*/bin/python3.12"), reverse=True)
    except OSError:
        pass
    candidates.append(shutil.which("python3.12"))
    for candidate in candidates:
        if candidate and subprocess.run([str(candidate), "-c", "pass"],
                                        capture_output=True).returncode == 0:
            return str(candidate)
    raise CarryError("no CPython 3.12 found: set PYTHON312 to one (the GPU machine runs 3.12)")


def build_venv(cache: Path) -> Path:
    """A CPython 3.12 virtual environment with the builder's needs (numpy, cython)."""
    venv = cache / "build-cp312"
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating the CPython 3.12 build environment {venv}")
        run([find_python312(), "-m", "venv", venv])
    check = subprocess.run([python, "-c", "import numpy, Cython, setuptools, wheel"],
                           capture_output=True)
    if check.returncode != 0:
        run([python, "-m", "pip", "install", "-q", "numpy>=2", "cython", "setuptools", "wheel"])
    return python


def make_wheels(target: Path, cache: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    python312 = build_venv(cache)
    fairseq_wheel = Path(run([sys.executable, REPO / "scripts" / "build_fairseq.py", "--python",
                              python312, "--cache", cache]).stdout.strip().splitlines()[-1])
    shutil.copy2(fairseq_wheel, target / fairseq_wheel.name)
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platform_args, "-d", target,
         *WHEELS])
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", target, *SOURCE_ONLY])


def prepare_multi30k(target: Path, shared_data: Path, tiny: bool) -> None:
    """Multi30k through the recipes' prepare and binarize steps, as the demo prepares it;
    ``tiny``: the first lines of each split only."""
    source = shared_data / "multi30k-en-de"
    if not source.is_dir():
        raise CarryError(f"{source} not found (set VASWANI_SHARED_DATA)")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        raw.mkdir()
        for split, name in MULTI30K_SPLITS.items():
            for lang in ("en", "de"):
                lines = (source / f"{name}.{lang}").read_text(encoding="utf-8")
                if tiny:
                    lines = "".join(lines.splitlines(keepends=True)[:TINY_LINES[split]])
                (raw / f"{split}.{lang}").write_text(lines, encoding="utf-8")
        ops = TINY_BPE_OPS if tiny else BPE_OPS
        env = dict(os.environ, RAW_DIR=str(raw), WORK_DIR=str(Path(tmp) / "work"),
                   BPE_OPS=str(ops), DATA_BIN=str(Path(tmp) / "bin"), WORKERS="1")
        for step in ("prepare", "binarize"):
            log(f"recipes/steps/{step}.sh wmt14_en_de (Multi30k, BPE {ops})")
            run(["bash", REPO / "recipes" / "steps" / f"{step}.sh", "wmt14_en_de"], env=env,
                cwd=REPO)
        target.mkdir(parents=True, exist_ok=True)
        for item in sorted(Path(tmp, "bin").iterdir()):
            if item.is_file() and not item.name.startswith("."):
                shutil.copy2(item, target / item.name)
        prep = next(Path(tmp, "work").rglob("bpe.codes")).parent
        shutil.copy2(prep / "bpe.codes", target / "bpe.codes")
        shutil.copy2(raw / "test.de", target / "test.raw.de")
        shutil.copy2(raw / "test.en", target / "test.raw.en")


def prepare_lengths(target: Path, shared_data: Path) -> None:
    """The length table of newstest2014 EN-DE (the speed section's corpus is drawn from it)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from user_plugin.measurement import synthetic_corpus

    source = shared_data / "newstest2014-en-de"
    if not source.is_dir():
        raise CarryError(f"{source} not found (set VASWANI_SHARED_DATA)")
    target.parent.mkdir(parents=True, exist_ok=True)
    pairs = synthetic_corpus.length_pairs(source / "newstest2014.en", source / "newstest2014.de")
    synthetic_corpus.write_length_pairs(pairs, target)
    log(f"{target.name}: {len(pairs)} length pairs of newstest2014 EN-DE")


def manifest_of(carry: Path) -> Dict[str, str]:
    return {str(p.relative_to(carry)): sha256(p) for p in sorted(carry.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def check(carry: Path) -> List[str]:
    """Problems with the carry folder (empty when it is complete and intact)."""
    manifest_path = carry / "manifest.json"
    if not manifest_path.exists():
        return [f"{manifest_path} missing"]
    recorded = json.loads(manifest_path.read_text())["files"]
    actual = manifest_of(carry)
    problems = [f"{name}: missing" for name in recorded if name not in actual]
    problems += [f"{name}: sha256 differs" for name in recorded
                 if name in actual and actual[name] != recorded[name]]
    problems += [f"{name}: not in the manifest" for name in actual if name not in recorded]
    tiny = json.loads(manifest_path.read_text()).get("tiny", False)
    if not tiny and not any(name.startswith("wheels/fairseq_fixed-") for name in recorded):
        problems.append("no fairseq wheel")
    if "data/multi30k/dict.en.txt" not in recorded:
        problems.append("no Multi30k data")
    if "data/wmt14_length_pairs.json" not in recorded:
        problems.append("no WMT14 length table")
    return problems


def build(carry: Path, cache: Path, shared_data: Path, tiny: bool = False) -> None:
    if not check(carry):
        log(f"{carry} is complete and intact (manifest checked); nothing to do")
        return
    staging = carry.with_name(carry.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    if not tiny:
        make_wheels(staging / "wheels", cache)
    prepare_multi30k(staging / "data" / "multi30k", shared_data, tiny)
    prepare_lengths(staging / "data" / "wmt14_length_pairs.json", shared_data)
    files = manifest_of(staging)
    size = sum((staging / name).stat().st_size for name in files)
    if size > MAX_BYTES:
        raise CarryError(f"{staging} holds {size / 2**20:.1f} MiB, over {MAX_BYTES / 2**20:.0f}")
    (staging / "manifest.json").write_text(json.dumps(
        {"files": files, "bytes": size, "tiny": tiny}, indent=1) + "\n")
    shutil.rmtree(carry, ignore_errors=True)
    os.replace(staging, carry)
    problems = check(carry)
    if problems:
        raise CarryError(f"{carry} failed its own check: {problems[0]}")
    log(f"{carry}: {len(files)} files, {size / 2**20:.1f} MiB, manifest written and checked")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--carry", type=Path, default=CARRY)
    parser.add_argument("--check", action="store_true", help="verify only; build nothing")
    parser.add_argument("--tiny", action="store_true",
                        help="data slices only, no wheels: for the check's CPU dry run")
    args = parser.parse_args(argv)
    cache = Path(os.environ.get("VASWANI_CACHE") or Path.home() / ".cache" / "vaswani")
    shared = Path(os.environ.get("VASWANI_SHARED_DATA") or REPO.parent / "shared" / "data")
    try:
        if args.check:
            problems = check(args.carry)
            if problems:
                raise CarryError(f"{args.carry}: {problems[0]} ({len(problems)} problem(s))")
            log(f"{args.carry} is complete and intact")
        else:
            build(args.carry, cache, shared, args.tiny)
    except CarryError as error:
        print(f"build_carry: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
