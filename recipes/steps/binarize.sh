#!/usr/bin/env bash
# Step 2, binarize: fairseq-preprocess the prepared text into DATA_BIN ($WORK_DIR/data-bin)
# with one dictionary shared by source and target (--joined-dictionary), which the paper's
# shared embedding and pre-softmax weight matrix need (§3.4).
#
#   bash recipes/steps/binarize.sh PAIR     (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Environment: WORK_DIR [work_dirs/<pair>], DATA_BIN [$WORK_DIR/data-bin], WORKERS [nproc].
set -euo pipefail
STEP_NAME=binarize
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
WORKERS=${WORKERS:-$(num_cpus)}
require_int WORKERS
S=$SRC_LANG
T=$TGT_LANG

config="v1 $S-$T joined-dictionary"
if step_is_done "$BIN_DIR" "$config" "$PREP_DIR"; then
  log "already done ($BIN_DIR/.done); skipping"
  exit 0
fi
require_step "$PREP_DIR" prepare
log "binarizing $PREP_DIR into $BIN_DIR (joined dictionary, $WORKERS workers)"
step_restart "$BIN_DIR"
run fairseq-preprocess --source-lang "$S" --target-lang "$T" \
  --trainpref "$PREP_DIR/train" --validpref "$PREP_DIR/valid" --testpref "$PREP_DIR/test" \
  --destdir "$BIN_DIR" --joined-dictionary --workers "$WORKERS"
mapfile -t outputs < <(preprocess_outputs "$S" "$T")
log "dictionary: $(wc -l < "$BIN_DIR/dict.$S.txt") types (+4 special symbols)"
step_mark_done "$BIN_DIR" "$config" "$PREP_DIR" -- "${outputs[@]}"
