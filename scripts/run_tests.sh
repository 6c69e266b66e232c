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
# Every process of the suite uses one thread (tests/conftest.py; the fairseq CLIs it starts get
# OMP_NUM_THREADS=1), so the files run side by side, one pytest-xdist worker per core (at most
# 4), each worker taking whole files (a module's fixtures are built once). The 25 slowest
# tests are listed at the end. Extra arguments go to pytest, after these (`-n 0`: one process).
workers=$(nproc 2>/dev/null || echo 1)
[ "$workers" -le 4 ] || workers=4
export OMP_NUM_THREADS=1
echo "[tests] running the test suite on $workers worker(s) (real fairseq CLIs on real data slices)"
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --durations=25 "$@"
