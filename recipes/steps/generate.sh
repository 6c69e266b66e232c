#!/usr/bin/env bash
# Step 5, generate (paper §6.1): translate the test set with the averaged model, beam size 4 and
# length penalty alpha 0.6, into $WORK_DIR/$MODEL/generate/hyp.detok.TGT (original sentence
# order, detokenised, one line per test sentence). Run through recipes/<pair>/generate.sh.
#
# The task vaswani_translation applies the paper's GNMT penalty ((5+|Y|)/6)^alpha and a maximum
# output length of source length + 50 per sentence. With TASK=translation (fairseq's own), the
# penalty is fairseq's |Y|^alpha and the length bound --max-len-a 1 --max-len-b 50 is per batch.
#
# Environment: WORK_DIR, MODEL [base|big], TASK [vaswani_translation], BEAM [4], LENPEN [0.6],
# CHECKPOINT [the averaged one], GEN_MAX_TOKENS [8000], DEVICE [gpu if visible, else cpu],
# PRECISION [fp16 on GPU], GEN_ARGS [none; more fairseq-generate options].
set -euo pipefail
STEP_NAME=generate
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# shellcheck disable=SC1090
source "${PAIR_CONFIG:?run recipes/<pair>/generate.sh, which sets PAIR_CONFIG}"
activate_venv
setup_paths
detect_device
TASK=${TASK:-vaswani_translation}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
CHECKPOINT=${CHECKPOINT:-$AVG_DIR/checkpoint_avg.pt}
GEN_MAX_TOKENS=${GEN_MAX_TOKENS:-8000}
GEN_ARGS=${GEN_ARGS:-}
require_int BEAM
require_int GEN_MAX_TOKENS
S=$SRC_LANG
T=$TGT_LANG

config="v1 task=$TASK beam=$BEAM lenpen=$LENPEN checkpoint=$CHECKPOINT args=$GEN_ARGS"
upstream=("$BIN_DIR" "$PREP_DIR")
[ "$CHECKPOINT" = "$AVG_DIR/checkpoint_avg.pt" ] && upstream+=("$AVG_DIR")
if step_is_done "$GEN_DIR" "$config" "${upstream[@]}"; then
  log "already done ($GEN_DIR/.done); skipping"
  exit 0
fi
require_step "$BIN_DIR" binarize
if [ "$CHECKPOINT" = "$AVG_DIR/checkpoint_avg.pt" ]; then
  require_step "$AVG_DIR" average
fi
[ -f "$CHECKPOINT" ] || die "checkpoint $CHECKPOINT not found"

if [ "$SUBWORD" = bpe ]; then
  post_process=(--remove-bpe)
else
  post_process=(--post-process sentencepiece)
fi
task_args=()
if [ "$TASK" = translation ]; then
  log "note: TASK=translation uses fairseq's length penalty |Y|^alpha, not the paper's GNMT penalty"
  task_args=(--max-len-a 1 --max-len-b 50)
fi
device_args=()
[ "$DEVICE" = cpu ] && device_args=(--cpu)
precision_args=()
[ "$PRECISION" = fp16 ] && precision_args=(--fp16)
# shellcheck disable=SC2206
extra=($GEN_ARGS)
expected=$(python "$PREPARE_TEXT" check-lines "$PREP_DIR/test.$S" "$PREP_DIR/test.ref.$T") \
  || die "prepared test set and reference differ in length"

step_restart "$GEN_DIR"
log "translating $expected test sentences with $CHECKPOINT (beam $BEAM, alpha $LENPEN, task $TASK)"
run fairseq-generate "$BIN_DIR" --user-dir "$PLUGIN_DIR" --task "$TASK" \
  --source-lang "$S" --target-lang "$T" --gen-subset test --path "$CHECKPOINT" \
  --beam "$BEAM" --lenpen "$LENPEN" --max-tokens "$GEN_MAX_TOKENS" \
  --required-batch-size-multiple 1 "${post_process[@]}" \
  "${task_args[@]}" "${device_args[@]}" "${precision_args[@]}" "${extra[@]}" \
  > "$GEN_DIR/generate-test.txt.tmp"
mv "$GEN_DIR/generate-test.txt.tmp" "$GEN_DIR/generate-test.txt"
python "$PREPARE_TEXT" extract-hypotheses --expected "$expected" \
  "$GEN_DIR/generate-test.txt" "$GEN_DIR/hyp.$T"
if [ "$SUBWORD" = bpe ]; then
  log "detokenising the hypotheses (sacremoses)"
  python "$PREPARE_TEXT" detokenize --lang "$T" "$GEN_DIR/hyp.$T" "$GEN_DIR/hyp.detok.$T"
else
  # SentencePiece decoding (--post-process sentencepiece) already gives untokenised text.
  cp "$GEN_DIR/hyp.$T" "$GEN_DIR/hyp.detok.$T"
fi
python "$PREPARE_TEXT" check-lines --expected "$expected" "$GEN_DIR/hyp.detok.$T" > /dev/null \
  || die "hypotheses and test set differ in length"
log "$expected hypotheses in $GEN_DIR/hyp.detok.$T"
step_mark_done "$GEN_DIR" "$config" "${upstream[@]}" -- generate-test.txt "hyp.$T" "hyp.detok.$T"
