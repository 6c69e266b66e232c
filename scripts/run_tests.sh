#!/usr/bin/env bash
# Set up .venv (idempotent, see scripts/setup_venv.sh) and run the whole test suite with it.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -k equivalence`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
# The browser test of vaswani-serve's page (tests/test_serving.py) drives Debian's chromium;
# installed here where apt-get can (as root), else that test skips saying why.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ]; then
  echo "[tests] installing chromium for the browser test (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
    >/dev/null 2>&1 || echo "[tests] chromium could not be installed: the browser test will skip"
fi
echo "[tests] running the test suite (real fairseq CLIs on real data slices; ~10-20 min on 2 cores)"
exec .venv/bin/python -m pytest "$@"
