#!/usr/bin/env bash
# Step 7, package: the averaged model as one model package in $RUN_DIR/model, with
# vaswani-package: the checkpoint without optimizer state, the dictionaries, the subword model
# and the text pipeline record, a manifest (every file's sha256, the architecture, the training
# fingerprint, the averaged checkpoints, the test scores of the score step) and a model card.
# It is what to hand around: vaswani-translate, vaswani-serve and vaswani-export take it with no
# other option (docs/translating.md). It is written once complete, with its scores, and never
# edited afterwards: its identity is its content.
#
#   bash recipes/steps/package.sh PAIR      (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Environment: WORK_DIR, MODEL [base|big], RUN_DIR [$WORK_DIR/$MODEL], TEST_SET_NAME [the pair's
# test set, e.g. newstest2014].
set -euo pipefail
STEP_NAME=package
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
PACKAGE_COMMAND=${PACKAGE_COMMAND:-vaswani-package}
TEST_SET_NAME=${TEST_SET_NAME:-$PAIR_NAME test}

config="v1 $TEST_SET_NAME"
skip_step_if_done "$PKG_DIR" "$config" "$AVG_DIR" "$BIN_DIR" "$SCORE_DIR"
require_step "$AVG_DIR" average
require_step "$SCORE_DIR" score
command -v "$PACKAGE_COMMAND" >/dev/null || die "$PACKAGE_COMMAND: no such command"
step_restart "$PKG_DIR"
run "$PACKAGE_COMMAND" "$AVG_DIR/checkpoint_avg.pt" --data-dir "$BIN_DIR" --output "$PKG_DIR" \
  --scores "$SCORE_DIR/bleu.json" --test-set "$TEST_SET_NAME"
mapfile -t outputs < <(cd "$PKG_DIR" && ls)
step_mark_done "$PKG_DIR" "$config" "$AVG_DIR" "$BIN_DIR" "$SCORE_DIR" -- "${outputs[@]}"
log "the model package: $PKG_DIR (vaswani-translate $PKG_DIR < raw.$SRC_LANG)"
