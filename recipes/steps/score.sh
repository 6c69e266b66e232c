#!/usr/bin/env bash
# Step 6, score (paper Table 2): BLEU of the test translations against the untouched reference,
# with vaswani-score: tokenized BLEU (with compound splitting for German, the
# paper's lineage) and sacreBLEU with its signature. Both are printed and saved in
# $RUN_DIR/score/{bleu.json,bleu.txt}.
#
#   bash recipes/steps/score.sh PAIR        (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Environment: WORK_DIR, MODEL [base|big], RUN_DIR [$WORK_DIR/$MODEL].
set -euo pipefail
STEP_NAME=score
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
SCORE_COMMAND=${SCORE_COMMAND:-vaswani-score}
T=$TGT_LANG

config="v1 $T"
# the reference is an input by its content: an edited reference is scored again
inputs=("$GEN_DIR" "$PREP_DIR/test.ref.$T")
if step_is_done "$SCORE_DIR" "$config" "${inputs[@]}"; then
  log "already done ($SCORE_DIR/.done); skipping"
  cat "$SCORE_DIR/bleu.txt"
  exit 0
fi
require_step "$GEN_DIR" generate
command -v "$SCORE_COMMAND" >/dev/null || die "$SCORE_COMMAND: no such command"
compound=()
[ "$T" = de ] || compound=(--no-compound-split)
step_restart "$SCORE_DIR"
log "scoring $GEN_DIR/hyp.detok.$T against $PREP_DIR/test.ref.$T"
run "$SCORE_COMMAND" --hyp "$GEN_DIR/hyp.detok.$T" --ref "$PREP_DIR/test.ref.$T" \
  --target-lang "$T" "${compound[@]}" --output-json "$SCORE_DIR/bleu.json" \
  > "$SCORE_DIR/bleu.txt.tmp"
mv "$SCORE_DIR/bleu.txt.tmp" "$SCORE_DIR/bleu.txt"
cat "$SCORE_DIR/bleu.txt"
[ -s "$SCORE_DIR/bleu.json" ] || die "$SCORE_COMMAND wrote no $SCORE_DIR/bleu.json"
step_mark_done "$SCORE_DIR" "$config" "${inputs[@]}" -- bleu.json bleu.txt
