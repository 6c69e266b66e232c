#!/usr/bin/env bash
# Set up .venv (idempotent, see scripts/setup_venv.sh) and run the whole test suite with it.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -k equivalence`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
echo "[tests] running the test suite (real fairseq CLIs on real data slices; ~10-20 min on 2 cores)"
exec .venv/bin/python -m pytest "$@"
