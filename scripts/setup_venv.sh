#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install vaswani into it.
# Idempotent: a second run only checks that nothing changed.
#
# Order matters: torch is pinned and installed first (an unpinned torch would pull a multi-GB
# CUDA build); fairseq-fixed then comes from scripts/build_fairseq.py, which compiles only the
# three extensions fairseq's text CLIs use (about 20 s, once; the wheel is cached in
# ~/.cache/vaswani) instead of the six of `pip install fairseq-fixed` (about 9 minutes on 2
# cores); `pip install -e .[test]` then finds fairseq-fixed satisfied.
#
# Environment: VENV (default .venv), PYTHON (default python3; 3.11 and 3.12 work),
# TORCH_SPEC (default torch==2.13.0), VASWANI_CACHE (the fairseq wheel's cache), EXTRAS
# (default test: the suite's tools, CTranslate2 and transformers among them; empty: only what
# the commands and recipes need, as the demo installs it). An environment set up with the test
# extras is up to date for an empty EXTRAS too.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
start=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null 2>&1 || { echo "[setup] error: no '$PYTHON' on PATH (set PYTHON)" >&2; exit 1; }
  echo "[setup] creating virtual environment $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
EXTRAS=${EXTRAS-test}
case "$EXTRAS" in
  ""|test) ;;
  *) echo "[setup] error: EXTRAS must be 'test' or empty, got '$EXTRAS'" >&2; exit 1 ;;
esac
# line 1: what was installed from; line 2: its extras
stamp="$VENV/.vaswani-installed"
want="$(cat setup.py scripts/setup_venv.sh scripts/build_fairseq.py | sha256sum | cut -c1-16) $TORCH_SPEC"
if [ -f "$stamp" ] && [ "$(sed -n 1p "$stamp")" = "$want" ] \
   && { [ -z "$EXTRAS" ] || [ "$(sed -n 2p "$stamp")" = "extras $EXTRAS" ]; } \
   && "$VENV/bin/python" -c "import fairseq, user_plugin" >/dev/null 2>&1; then
  echo "[setup] $VENV is up to date"
  exit 0
fi
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
echo "[setup] installing $TORCH_SPEC and the build tools"
# torch with --no-compile: pip would byte-compile every one of its modules (17 of its 30 s on 2
# cores); Python compiles those a command imports, once, on first use. Only torch: compiling
# fairseq on first use would print its sources' SyntaxWarnings (Python 3.12) into a command's
# output, which pip's own compiling keeps quiet.
"${pip[@]}" --no-compile "$TORCH_SPEC" setuptools wheel numpy cython
echo "[setup] fairseq-fixed with the three extensions the plugin needs (scripts/build_fairseq.py)"
wheel=$("$VENV/bin/python" scripts/build_fairseq.py | tail -n 1)
"${pip[@]}" "$wheel"
if [ -n "$EXTRAS" ]; then
  echo "[setup] vaswani and its test tools (pip install -e .[$EXTRAS])"
  "${pip[@]}" -e ".[$EXTRAS]"
else
  echo "[setup] vaswani (pip install -e .; EXTRAS=test adds the suite's tools)"
  "${pip[@]}" -e .
fi
printf '%s\nextras %s\n' "$want" "$EXTRAS" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
echo "[setup] done in $(( $(date +%s) - start )) s: $("$VENV/bin/python" -c 'import torch, fairseq; print("torch", torch.__version__, "fairseq", fairseq.__version__)')"
