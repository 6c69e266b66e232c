#!/usr/bin/env bash
# WMT14 English-German, all steps in order: prepare, binarize, train, average, generate, score.
# Each step skips itself when already done, so an interrupted run_all.sh can simply be rerun.
# Configure with the environment variables of recipes/steps/*.sh (WORK_DIR, RAW_DIR, MODEL, ...).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for step in prepare binarize train average generate score; do
  echo "[run_all] === $step ===" >&2
  bash "$here/$step.sh"
done
