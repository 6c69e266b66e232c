#!/usr/bin/env python
"""Build a wheel of ``fairseq-fixed`` 0.12.3.1 for one Python, with only the extensions the plugin
needs, and keep it in a cache so that later set-ups install it in seconds.

fairseq-fixed's own build compiles six extensions (about 9 minutes on 2 cores). ``fairseq-train``,
``fairseq-generate``, ``fairseq-preprocess`` and ``fairseq-interactive`` need only the three that
do not use torch: ``fairseq.libbleu``, ``fairseq.data.data_utils_fast`` and
``fairseq.data.token_block_utils_fast`` (about 35 s). The others (``libbase``: BASE layers,
``libnat``: non-autoregressive edit distance, the alignment-training operators) serve models
this plugin does not build.

What it does, idempotently:

1. fetches the sdist with pip (once, into the cache) and checks its sha256 against the pinned one;
2. compiles the three extensions for the target interpreter (``--python``) with our own
   setuptools description of the package (the sdist's ``setup.py`` imports torch and always
   builds all six);
3. writes ``fairseq_fixed-0.12.3.1-<tag>.whl`` into the cache, checks that it holds the three
   compiled modules and fairseq's configuration files, and records its sha256 next to it;
4. prints the wheel's path. A second run finds the wheel, re-checks it, and prints the path.

The target interpreter needs ``setuptools``, ``wheel``, ``numpy`` and ``cython``; a C++ compiler
must be on ``PATH``. Either missing gives one line naming it. Environment: ``VASWANI_CACHE``
(default ``~/.cache/vaswani``).

Usage::

    python scripts/build_fairseq.py                       # for this interpreter
    python scripts/build_fairseq.py --python python3.12   # for another one (cross-version)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import List, Optional, Sequence

PACKAGE = "fairseq-fixed"
VERSION = "0.12.3.1"
SDIST = f"fairseq_fixed-{VERSION}.tar.gz"
SDIST_SHA256 = "c607577a54ab30e2ee0f0b0a754ea5cdbc6ad0a9f99a1726638a2201445bc1cc"
#: The compiled modules the wheel must hold (module path -> source files in the sdist).
EXTENSIONS = {
    "fairseq.libbleu": ["fairseq/clib/libbleu/libbleu.cpp", "fairseq/clib/libbleu/module.cpp"],
    "fairseq.data.data_utils_fast": ["fairseq/data/data_utils_fast.pyx"],
    "fairseq.data.token_block_utils_fast": ["fairseq/data/token_block_utils_fast.pyx"],
}
#: What fairseq imports at ``import fairseq`` or in its text CLIs; torchaudio (speech only) is
#: left out, scikit-learn and scipy stay (fairseq's task and criterion registries import them).
REQUIRES = [
    "hydra-core==1.3.2", "omegaconf==2.3.0", "numpy>=1.21.3", "regex", "sacrebleu>=1.4.12",
    "torch>=1.13", "tqdm", "bitarray", "packaging", "scikit-learn", "cffi",
]
CONSOLE_SCRIPTS = [
    f"fairseq-{name} = fairseq_cli.{module}:cli_main"
    for name, module in (("eval-lm", "eval_lm"), ("generate", "generate"),
                         ("hydra-train", "hydra_train"), ("interactive", "interactive"),
                         ("preprocess", "preprocess"), ("score", "score"), ("train", "train"),
                         ("validate", "validate"))
]
BUILD_REQUIREMENTS = ("setuptools", "wheel", "numpy", "Cython")


class BuildError(Exception):
    """A build that cannot go on: the message is the one line the user sees."""


def default_cache() -> Path:
    return Path(os.environ.get("VASWANI_CACHE") or Path.home() / ".cache" / "vaswani")


def sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def python_tag(python: str) -> str:
    """``cp311`` for a CPython 3.11 interpreter, and so on."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        raise BuildError(f"cannot run the target interpreter {python!r}: {error}") from None
    return out


def check_toolchain(python: str) -> None:
    missing = subprocess.run(
        [python, "-c",
         "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m) is None))"
         % (BUILD_REQUIREMENTS,)],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    if missing:
        raise BuildError(f"{python} lacks {', '.join(missing)}: "
                         f"`{python} -m pip install {' '.join(missing)}` first")
    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        raise BuildError("no C++ compiler on PATH (install g++, e.g. `apt-get install g++`)")


def fetch_sdist(cache: Path) -> Path:
    """The verified sdist in ``cache``, fetched with pip once."""
    target = cache / SDIST
    if target.exists() and sha256(target) == SDIST_SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    print(f"[build_fairseq] fetching the {PACKAGE} {VERSION} sdist with pip", flush=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        # --no-build-isolation: pip prepares the sdist's metadata with this interpreter (which
        # has torch) instead of installing torch into an isolated build environment first.
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", PACKAGE,
             "--no-build-isolation", f"{PACKAGE}=={VERSION}", "-d", tmp],
            capture_output=True, text=True,
        )
        fetched = Path(tmp) / SDIST
        if result.returncode != 0 or not fetched.exists():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"pip could not fetch {PACKAGE}=={VERSION}: {last}")
        if sha256(fetched) != SDIST_SHA256:
            raise BuildError(f"{SDIST} fetched with sha256 {sha256(fetched)}, "
                             f"expected {SDIST_SHA256}: refusing to build it")
        os.replace(fetched, target)
    return target


SETUP_TEMPLATE = '''\
import os
from setuptools import Extension, find_packages, setup
import numpy

def data_files(top):
    found = []
    for root, _dirs, files in os.walk(top):
        found += [os.path.relpath(os.path.join(root, f), "fairseq") for f in files
                  if not f.endswith(".pyc")]
    return found

extensions = [Extension(name, sources, language="c++", include_dirs=[numpy.get_include()],
                        extra_compile_args=["-std=c++11", "-O3"])
              for name, sources in {extensions!r}.items()]
setup(
    name={package!r}, version={version!r},
    packages=find_packages(include=["fairseq", "fairseq.*", "fairseq_cli", "fairseq_cli.*"],
                           exclude=["fairseq.examples", "fairseq.examples.*"]),
    package_data={{"fairseq": data_files(os.path.join("fairseq", "config")) + ["version.txt"]}},
    ext_modules=extensions,
    install_requires={requires!r},
    entry_points={{"console_scripts": {scripts!r}}},
    zip_safe=False,
)
'''


def compiled_modules(wheel: Path) -> List[str]:
    with zipfile.ZipFile(wheel) as archive:
        if archive.testzip() is not None:
            raise BuildError(f"{wheel} is damaged")
        names = archive.namelist()
    found = []
    for module in EXTENSIONS:
        stem = module.replace(".", "/")
        if any(n.startswith(stem + ".") and n.endswith(".so") for n in names):
            found.append(module)
    if not any(n.startswith("fairseq/config/") and n.endswith(".yaml") for n in names):
        raise BuildError(f"{wheel} lacks fairseq/config/*.yaml")
    return found


def verified(wheel: Path) -> bool:
    """True when ``wheel`` exists, matches its recorded sha256 and holds the three modules."""
    record = wheel.with_name(wheel.name + ".sha256")
    if not (wheel.exists() and record.exists()):
        return False
    if record.read_text().strip() != sha256(wheel):
        return False
    return len(compiled_modules(wheel)) == len(EXTENSIONS)


def build(python: str, cache: Path) -> Path:
    tag = python_tag(python)
    wheels = cache / "wheels"
    existing = sorted(wheels.glob(f"fairseq_fixed-{VERSION}-{tag}-{tag}-*.whl"))
    for wheel in existing:
        if verified(wheel):
            return wheel
    check_toolchain(python)
    sdist = fetch_sdist(cache)
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"[build_fairseq] compiling {len(EXTENSIONS)} extensions for {tag}", flush=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        source = Path(tmp) / f"fairseq_fixed-{VERSION}"
        # The sdist links fairseq/examples to ../examples; the wheel does not carry examples.
        examples = source / "fairseq" / "examples"
        if examples.is_symlink():
            examples.unlink()
        (source / "fairseq" / "version.py").write_text(f'__version__ = "{VERSION}"\n')
        (source / "vaswani_build.py").write_text(SETUP_TEMPLATE.format(
            extensions=EXTENSIONS, package=PACKAGE, version=VERSION, requires=REQUIRES,
            scripts=CONSOLE_SCRIPTS))
        dist = Path(tmp) / "dist"
        jobs = str(max(1, os.cpu_count() or 1))
        result = subprocess.run(
            [python, "vaswani_build.py", "-q", "build_ext", "-j", jobs, "bdist_wheel",
             "--dist-dir", str(dist)],
            cwd=source, capture_output=True, text=True,
        )
        built = sorted(dist.glob("*.whl"))
        if result.returncode != 0 or not built:
            lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
            raise BuildError(f"compiling {PACKAGE} failed: "
                             f"{(lines or result.stderr.splitlines() or ['no output'])[-1]}")
        wheel = built[0]
        found = compiled_modules(wheel)
        if len(found) != len(EXTENSIONS):
            raise BuildError(f"{wheel.name} holds only {found} of {sorted(EXTENSIONS)}")
        target = wheels / wheel.name
        os.replace(wheel, target)
    target.with_name(target.name + ".sha256").write_text(sha256(target) + "\n")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter to build for (default: this one)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where the sdist and wheels are kept (default: $VASWANI_CACHE or "
                             "~/.cache/vaswani)")
    args = parser.parse_args(argv)
    try:
        wheel = build(args.python, args.cache or default_cache())
    except BuildError as error:
        print(f"build_fairseq: error: {error}", file=sys.stderr)
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
