#!/usr/bin/env bash
# Set up .venv (idempotent, see scripts/setup_venv.sh) and run the whole test suite with it.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -k equivalence`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
# Debian's packages that serve tests: chromium (the page's browser test), wrk (the serving
# benchmark's load generator), nginx (replicas behind a load balancer). Installed here where
# apt-get can (as root); a test whose package is missing skips, saying why.
missing=()
for package in chromium wrk nginx; do
  command -v "$package" >/dev/null 2>&1 || [ -x "/usr/sbin/$package" ] || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "[tests] installing ${missing[*]} for the tests that drive them (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >/dev/null 2>&1 || echo "[tests] ${missing[*]}: could not be installed; their tests will skip"
fi
# Every process of the suite uses one thread (tests/conftest.py; the fairseq CLIs it starts get
# OMP_NUM_THREADS=1), so the files run side by side, one pytest-xdist worker per core (at most
# 4), each worker taking whole files (a module's fixtures are built once), the slowest files
# first (tests/conftest.py, SLOWEST_FIRST) so that the workers finish together. The 25 slowest
# tests and the 15 slowest files are listed at the end. Extra arguments go to pytest, after
# these (`-n 0`: one process).
workers=$(nproc 2>/dev/null || echo 1)
[ "$workers" -le 4 ] || workers=4
export OMP_NUM_THREADS=1
echo "[tests] running the test suite on $workers worker(s) (real fairseq CLIs on real data slices)"
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder --durations=25 "$@"
