#!/usr/bin/env bash
# Step 4, average (paper §6.1): the mean of the last AVERAGE_LAST interval checkpoints (5 for
# base, 20 for big) into $RUN_DIR/average/checkpoint_avg.pt, with
# vaswani-average.
#
#   bash recipes/steps/average.sh PAIR      (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Environment: WORK_DIR, MODEL [base|big], RUN_DIR [$WORK_DIR/$MODEL], AVERAGE_LAST [paper: 5 |
# 20]. When training kept fewer interval checkpoints than AVERAGE_LAST, all of them are
# averaged (with a warning).
set -euo pipefail
STEP_NAME=average
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
model_defaults
AVERAGE_COMMAND=${AVERAGE_COMMAND:-vaswani-average}
[ "$AVERAGE_LAST" -gt 0 ] || die "AVERAGE_LAST must be positive"

config="v1 last=$AVERAGE_LAST"
skip_step_if_done "$AVG_DIR" "$config" "$CKPT_DIR"
require_step "$CKPT_DIR" train
command -v "$AVERAGE_COMMAND" >/dev/null || die "$AVERAGE_COMMAND: no such command"
available=$(cd "$CKPT_DIR" && ls checkpoint_[0-9]*_[0-9]*.pt 2>/dev/null | wc -l)
[ "$available" -gt 0 ] || die "no interval checkpoints (checkpoint_E_U.pt) in $CKPT_DIR"
count=$AVERAGE_LAST
if [ "$available" -lt "$count" ]; then
  log "warning: only $available interval checkpoints in $CKPT_DIR; averaging those instead of $count"
  count=$available
fi
step_restart "$AVG_DIR"
log "averaging the last $count update checkpoints of $CKPT_DIR"
run "$AVERAGE_COMMAND" --inputs "$CKPT_DIR" --num-update-checkpoints "$count" \
  --output "$AVG_DIR/checkpoint_avg.pt"
[ -s "$AVG_DIR/checkpoint_avg.pt" ] || die "$AVERAGE_COMMAND wrote no $AVG_DIR/checkpoint_avg.pt"
# The text pipeline record and its subword model travel with the averaged model (the hub reads
# them); data prepared elsewhere has none, and the hub then says which pipeline it assumes.
carried=()
if [ -f "$PREP_DIR/text_pipeline.json" ]; then
  subword_model=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["subword_model"])' \
    "$PREP_DIR/text_pipeline.json") || die "$PREP_DIR/text_pipeline.json is not readable"
  for name in text_pipeline.json "$subword_model"; do
    cp "$PREP_DIR/$name" "$AVG_DIR/$name.tmp" && mv "$AVG_DIR/$name.tmp" "$AVG_DIR/$name"
    carried+=("$name")
  done
fi
step_mark_done "$AVG_DIR" "$config" "$CKPT_DIR" -- checkpoint_avg.pt "${carried[@]}"
