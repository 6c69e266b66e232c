#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install vaswani into it.
# Idempotent: a second run only checks that nothing changed. torch is pinned and installed first,
# because an unpinned torch would pull a multi-GB CUDA build; fairseq-fixed then compiles its
# extensions once (about 8 minutes on 2 cores) and pip's wheel cache makes re-installs fast.
#
# Environment: VENV (default .venv), PYTHON (default python3), TORCH_SPEC (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.vaswani-installed"
want="$(cat setup.py scripts/setup_venv.sh | sha256sum | cut -c1-16) $TORCH_SPEC"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$VENV/bin/python" -c "import fairseq, user_plugin" >/dev/null 2>&1; then
  echo "[setup] $VENV is up to date"
  exit 0
fi
echo "[setup] installing $TORCH_SPEC, then vaswani with fairseq (first time: ~8 minutes)"
"$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -e ".[test]"
echo "$want" > "$stamp"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, fairseq; print("torch", torch.__version__, "fairseq", fairseq.__version__)')"
