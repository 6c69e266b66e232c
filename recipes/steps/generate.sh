#!/usr/bin/env bash
# Step 5, generate (paper §6.1): translate the test set with the averaged model, beam size 4 and
# length penalty alpha 0.6, into $RUN_DIR/generate/hyp.detok.TGT (original sentence order,
# detokenised, one line per test sentence).
#
#   bash recipes/steps/generate.sh PAIR     (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# The task vaswani_translation applies the paper's GNMT penalty ((5+|Y|)/6)^alpha and a maximum
# output length of source length + 50 per sentence. With TASK=translation (fairseq's own), the
# penalty is fairseq's |Y|^alpha and the length bound --max-len-a 1 --max-len-b 50 is per batch
# (recipes/common.sh, decoding_args).
#
# Environment (defaults in brackets): WORK_DIR, MODEL [base|big], RUN_DIR [$WORK_DIR/$MODEL],
# TASK [vaswani_translation], BEAM [paper: 4], LENPEN [paper: 0.6], MAX_LEN_A [1], MAX_LEN_B
# [paper: 50], CHECKPOINT [the averaged one], GEN_MAX_TOKENS [8000], DEVICE [gpu if visible,
# else cpu], PRECISION [fp16 on GPU], GEN_ARGS [none; more fairseq-generate options].
set -euo pipefail
STEP_NAME=generate
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
detect_device
TASK=${TASK:-vaswani_translation}
decoding_defaults
CHECKPOINT=${CHECKPOINT:-$AVG_DIR/checkpoint_avg.pt}
GEN_MAX_TOKENS=${GEN_MAX_TOKENS:-8000}
GEN_ARGS=${GEN_ARGS:-}
require_int GEN_MAX_TOKENS
S=$SRC_LANG
T=$TGT_LANG

config="v1 task=$TASK beam=$BEAM lenpen=$LENPEN max_len=$MAX_LEN_A,$MAX_LEN_B"
config+=" checkpoint=$CHECKPOINT args=$GEN_ARGS"
upstream=("$BIN_DIR" "$PREP_DIR")
[ "$CHECKPOINT" = "$AVG_DIR/checkpoint_avg.pt" ] && upstream+=("$AVG_DIR")
skip_step_if_done "$GEN_DIR" "$config" "${upstream[@]}"
require_step "$BIN_DIR" binarize
if [ "$CHECKPOINT" = "$AVG_DIR/checkpoint_avg.pt" ]; then
  require_step "$AVG_DIR" average
fi
[ -f "$CHECKPOINT" ] || die "checkpoint $CHECKPOINT not found"

decoding_args
precision_args=()
[ "$PRECISION" = fp16 ] && precision_args=(--fp16)
read -r -a extra <<< "$GEN_ARGS"
expected=$("$PREPARE_TEXT" check-lines "$PREP_DIR/test.$S" "$PREP_DIR/test.ref.$T") \
  || die "prepared test set and reference differ in length"

ask decoding "beam=$BEAM" "lenpen=$LENPEN" || die "$ANSWER"  # before anything is emptied
step_restart "$GEN_DIR"
log "translating $expected test sentences with $CHECKPOINT (beam $BEAM, alpha $LENPEN, task $TASK)"
run fairseq-generate "$BIN_DIR" "${DECODING_ARGS[@]}" \
  --source-lang "$S" --target-lang "$T" --gen-subset test --path "$CHECKPOINT" \
  --max-tokens "$GEN_MAX_TOKENS" --post-process "$SUBWORD_POST_PROCESS" \
  "${precision_args[@]}" "${extra[@]}" > "$GEN_DIR/generate-test.txt.tmp"
mv "$GEN_DIR/generate-test.txt.tmp" "$GEN_DIR/generate-test.txt"
"$PREPARE_TEXT" extract-hypotheses --expected "$expected" \
  "$GEN_DIR/generate-test.txt" "$GEN_DIR/hyp.$T"
if [ "$SUBWORD" = bpe ]; then
  log "detokenising the hypotheses (sacremoses)"
  "$PREPARE_TEXT" detokenize --lang "$T" "$GEN_DIR/hyp.$T" "$GEN_DIR/hyp.detok.$T"
else
  # SentencePiece decoding (--post-process sentencepiece) already gives untokenised text.
  cp "$GEN_DIR/hyp.$T" "$GEN_DIR/hyp.detok.$T"
fi
"$PREPARE_TEXT" check-lines --expected "$expected" "$GEN_DIR/hyp.detok.$T" > /dev/null \
  || die "hypotheses and test set differ in length"
log "$expected hypotheses in $GEN_DIR/hyp.detok.$T"
step_mark_done "$GEN_DIR" "$config" "${upstream[@]}" -- generate-test.txt "hyp.$T" "hyp.detok.$T"
