#!/usr/bin/env bash
# Parsing step 4, generate (paper §6.3): parse GEN_SUBSET with beam 21, GNMT length penalty
# alpha 0.3 and at most input length + 300 output tokens (task vaswani_translation), take the
# hypotheses in sentence order and turn them into trees over the input words: malformed outputs
# are repaired and unusable ones replaced by a flat tree, all counted (repairs.json). The trees
# have the predicted part-of-speech tags; with POS_TAGS=xx (prepare step), which predicts none,
# they take the gold tags, so that EVALB deletes the same punctuation on both sides. A sentence
# ends when no live hypothesis can beat its finished ones (STOP_RULE no-better, the paper's
# "terminate early when possible"): fairseq's rule (beam-full) ends it once 21 hypotheses have
# ended, and over a 40-symbol vocabulary early junk endings fill that quota (docs/parsing.md).
#
# Environment: CHECKPOINT [checkpoints/checkpoint_best.pt], BEAM [21], LENPEN [0.3],
# MAX_LEN_OVER_SOURCE [300], STOP_RULE [no-better], GEN_MAX_TOKENS [4000], GEN_ARGS [none],
# DEVICE, PRECISION,
# GEN_SUBSET and WORK_DIR (settings.sh).
set -euo pipefail
STEP_NAME=generate
# shellcheck source=settings.sh
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
detect_device
CHECKPOINT=${CHECKPOINT:-$CKPT_DIR/checkpoint_best.pt}
BEAM=${BEAM:-$PAPER_PARSING_BEAM}
LENPEN=${LENPEN:-$PAPER_PARSING_LENPEN}
MAX_LEN_OVER_SOURCE=${MAX_LEN_OVER_SOURCE:-$PAPER_PARSING_MAX_LEN_OVER_SOURCE}
STOP_RULE=${STOP_RULE:-no-better}
GEN_MAX_TOKENS=${GEN_MAX_TOKENS:-4000}
GEN_ARGS=${GEN_ARGS:-}
require_int BEAM
require_int MAX_LEN_OVER_SOURCE
require_int GEN_MAX_TOKENS

config="v1 subset=$GEN_SUBSET checkpoint=$CHECKPOINT beam=$BEAM lenpen=$LENPEN"
config+=" max_len_over_source=$MAX_LEN_OVER_SOURCE stop_rule=$STOP_RULE args=$GEN_ARGS"
upstream=("$PREP_DIR" "$BIN_DIR")
[ "$CHECKPOINT" = "$CKPT_DIR/checkpoint_best.pt" ] && upstream+=("$CKPT_DIR")
skip_step_if_done "$GEN_DIR" "$config" "${upstream[@]}"
require_step "$BIN_DIR" binarize
[ "$CHECKPOINT" = "$CKPT_DIR/checkpoint_best.pt" ] && require_step "$CKPT_DIR" train
[ -f "$CHECKPOINT" ] || die "checkpoint $CHECKPOINT not found"
pos_tags=$(json_value "$PREP_DIR/prepare.json" pos_tags) \
  || die "cannot read $PREP_DIR/prepare.json"
tags_from=()
[ "$pos_tags" = xx ] && tags_from=(--tags-from "$PREP_DIR/$GEN_SUBSET.gold")
expected=$("$PREPARE_TEXT" check-lines "$PREP_DIR/$GEN_SUBSET.$SRC" \
  "$PREP_DIR/$GEN_SUBSET.gold") || die "prepared $GEN_SUBSET words and trees differ in length"
device_args=()
[ "$DEVICE" = cpu ] && device_args=(--cpu)
precision_args=()
[ "$PRECISION" = fp16 ] && precision_args=(--fp16)
# shellcheck disable=SC2206
extra=($GEN_ARGS)

step_restart "$GEN_DIR"
log "parsing $expected $GEN_SUBSET sentences with $CHECKPOINT (beam $BEAM, alpha $LENPEN, input + $MAX_LEN_OVER_SOURCE, stop rule $STOP_RULE)"
run fairseq-generate "$BIN_DIR" --user-dir "$PLUGIN_DIR" --task vaswani_translation \
  --source-lang "$SRC" --target-lang "$TGT" --gen-subset "$GEN_SUBSET" --path "$CHECKPOINT" \
  --beam "$BEAM" --lenpen "$LENPEN" --max-len-over-source "$MAX_LEN_OVER_SOURCE" \
  --stop-rule "$STOP_RULE" \
  --max-tokens "$GEN_MAX_TOKENS" --required-batch-size-multiple 1 \
  "${device_args[@]}" "${precision_args[@]}" "${extra[@]}" > "$GEN_DIR/generate.txt.tmp"
mv "$GEN_DIR/generate.txt.tmp" "$GEN_DIR/generate.txt"
run "$PREPARE_TEXT" extract-hypotheses --expected "$expected" \
  "$GEN_DIR/generate.txt" "$GEN_DIR/hyp.$TGT"
run "$PREPARE_TREES" delinearize --words "$PREP_DIR/$GEN_SUBSET.$SRC" \
  --hypotheses "$GEN_DIR/hyp.$TGT" "${tags_from[@]}" \
  --output "$GEN_DIR/parsed.trees" --report "$GEN_DIR/repairs.json"
step_mark_done "$GEN_DIR" "$config" "${upstream[@]}" -- \
  generate.txt "hyp.$TGT" parsed.trees repairs.json
