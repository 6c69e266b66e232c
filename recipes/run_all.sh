#!/usr/bin/env bash
# Every step of a language pair, in order: prepare, binarize, train, average, generate, score,
# package (the model package, $RUN_DIR/model, that every command takes).
#
#   bash recipes/run_all.sh PAIR            (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Each step skips itself when already done, so an interrupted run_all.sh can simply be rerun.
# Configure with the environment variables of recipes/steps/*.sh (WORK_DIR, RAW_DIR, MODEL, ...).
set -euo pipefail
STEP_NAME=run_all
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
load_pair "$@"
for step in prepare binarize train average generate score package; do
  log "=== $step ($PAIR) ==="
  bash "$RECIPES_DIR/steps/$step.sh" "$PAIR"
done
