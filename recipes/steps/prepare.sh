#!/usr/bin/env bash
# Step 1, prepare (paper §5.1): raw parallel text -> normalised, tokenised, cleaned and
# subword-split text in $WORK_DIR/prepared.
#
#   bash recipes/steps/prepare.sh PAIR      (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Raw text comes from a local mirror when RAW_DIR is set, else from the WMT14 downloads
# (verified by size + sha256 or md5, kept in DOWNLOAD_DIR across runs). RAW_DIR layout: plain
# UTF-8 text, one sentence per line, line N of each .SRC file aligned with line N of .TGT:
#   $RAW_DIR/train.SRC train.TGT   training text
#   $RAW_DIR/valid.SRC valid.TGT   development set (newstest2013)
#   $RAW_DIR/test.SRC  test.TGT    test set (newstest2014); test.TGT is the scoring reference
#
# Pipeline: Moses punctuation normalisation; Moses tokenisation for BPE (SentencePiece reads
# the normalised text untokenised); training pairs cleaned to MIN_LEN..MAX_LEN tokens and a
# length ratio <= LEN_RATIO (dev and test are never filtered); then joint BPE with BPE_OPS
# merges (subword-nmt) or a joint SentencePiece model with SPM_VOCAB pieces.
#
# Environment (defaults in brackets): WORK_DIR [work_dirs/<pair>], RAW_DIR [unset: download],
# DOWNLOAD_DIR [$WORK_DIR/downloads], TRAIN_LINES [0 = all; else the first N training pairs],
# MIN_LEN [1], MAX_LEN [250], LEN_RATIO [1.5], BPE_OPS [32000 merges: about 37000 types, the
# paper's EN-DE vocabulary], SPM_VOCAB [paper: 32000, EN-FR's word pieces],
# SPM_MODEL_TYPE [unigram], SPM_SAMPLE [10000000 sentences to train SentencePiece on],
# WORKERS [nproc].
set -euo pipefail
STEP_NAME=prepare
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# shellcheck source=../downloads.sh
source "$RECIPES_DIR/downloads.sh"
start_pair_run "$@"

RAW_DIR=${RAW_DIR:-}
require_usable_path RAW_DIR
if [ -n "$RAW_DIR" ]; then
  given=$RAW_DIR
  RAW_DIR=$(cd "$given" 2>/dev/null && pwd) || die "RAW_DIR '$given' is not a directory"
fi
DOWNLOAD_DIR=${DOWNLOAD_DIR:-$WORK_DIR/downloads}
TRAIN_LINES=${TRAIN_LINES:-0}
MIN_LEN=${MIN_LEN:-1}
MAX_LEN=${MAX_LEN:-250}
LEN_RATIO=${LEN_RATIO:-1.5}
BPE_OPS=${BPE_OPS:-32000}
SPM_VOCAB=${SPM_VOCAB:-$PAPER_WORDPIECE_VOCAB}
SPM_MODEL_TYPE=${SPM_MODEL_TYPE:-unigram}
SPM_SAMPLE=${SPM_SAMPLE:-10000000}
WORKERS=${WORKERS:-$(num_cpus)}
for name in TRAIN_LINES MIN_LEN MAX_LEN BPE_OPS SPM_VOCAB SPM_SAMPLE WORKERS; do
  require_int "$name"
done
for name in BPE_OPS SPM_VOCAB; do
  [ "${!name}" -ge 1 ] || die "$name must be at least 1, got ${!name}"
done
[ "$MIN_LEN" -le "$MAX_LEN" ] || die "MIN_LEN ($MIN_LEN) must not exceed MAX_LEN ($MAX_LEN)"
S=$SRC_LANG
T=$TGT_LANG

if [ "$SUBWORD" = bpe ]; then
  subword_config="bpe ops=$BPE_OPS"
  subword_outputs=(bpe.codes)
else
  subword_config="sentencepiece vocab=$SPM_VOCAB type=$SPM_MODEL_TYPE sample=$SPM_SAMPLE"
  subword_outputs=(spm.model spm.vocab)
fi
config="v1 $S-$T raw=${RAW_DIR:-download} train_lines=$TRAIN_LINES len=$MIN_LEN..$MAX_LEN"
config+=" ratio=$LEN_RATIO $subword_config"
# The raw text of a local mirror is identified by its content (sha256 of each file), so that a
# file edited in place (a corrected reference) redoes the step.
raw_inputs=()
if [ -n "$RAW_DIR" ]; then
  for split in train valid test; do
    for lang in "$S" "$T"; do
      raw_inputs+=("$RAW_DIR/$split.$lang")
    done
  done
fi
skip_step_if_done "$PREP_DIR" "$config" "${raw_inputs[@]}"
# redoing finished data would start the run in CKPT_DIR over, deleting its checkpoints
ask keep-trained "$PREP_DIR" "$CKPT_DIR" "${START_OVER:-0}" "$ANSWER" || die "$ANSWER"

log "preparing $S-$T text in $PREP_DIR ($subword_config, workers $WORKERS)"
step_restart "$PREP_DIR"
tmp="$PREP_DIR/work"
mkdir -p "$tmp"

# ---- 1. raw text -----------------------------------------------------------------------------
if [ -n "$RAW_DIR" ]; then
  log "reading the local mirror $RAW_DIR"
  for split in train valid test; do
    for lang in "$S" "$T"; do
      [ -f "$RAW_DIR/$split.$lang" ] || die "$RAW_DIR/$split.$lang is missing (expected files: {train,valid,test}.{$S,$T})"
      cp "$RAW_DIR/$split.$lang" "$tmp/raw.$split.$lang"
    done
    n=$("$PREPARE_TEXT" check-lines "$tmp/raw.$split.$S" "$tmp/raw.$split.$T") \
      || die "$RAW_DIR/$split.$S and $split.$T must have the same number of lines"
    log "$split: $n pairs"
  done
else
  log "downloading WMT14 into $DOWNLOAD_DIR (verified; kept for later runs)"
  : > "$tmp/raw.train.$S"
  : > "$tmp/raw.train.$T"
  for entry in "${TRAIN_CORPORA[@]}"; do
    IFS='|' read -r archive url size sha src_member tgt_member <<< "$entry"
    download "$url" "$DOWNLOAD_DIR/$archive" "$size" "$sha"
    append_parallel "$DOWNLOAD_DIR/$archive" "$src_member" "$tgt_member" \
      "$tmp/raw.train.$S" "$tmp/raw.train.$T"
  done
  for entry in "valid|$DEV_SET" "test|$TEST_SET"; do
    IFS='|' read -r split archive url md5 src_member tgt_member lines <<< "$entry"
    download_md5 "$url" "$DOWNLOAD_DIR/$archive" "$md5"
    for side in src tgt; do
      if [ $side = src ]; then member=$src_member; lang=$S; else member=$tgt_member; lang=$T; fi
      archive_member "$DOWNLOAD_DIR/$archive" "$member" > "$tmp/$split.$lang.sgm" \
        || die "cannot read $member from $DOWNLOAD_DIR/$archive"
      "$PREPARE_TEXT" sgm-to-text "$tmp/$split.$lang.sgm" "$tmp/raw.$split.$lang"
    done
    "$PREPARE_TEXT" check-lines --expected "$lines" "$tmp/raw.$split.$S" "$tmp/raw.$split.$T" \
      > /dev/null || die "$split set: unexpected line counts"
  done
fi
if [ "$TRAIN_LINES" -gt 0 ]; then
  log "keeping the first $TRAIN_LINES training pairs (TRAIN_LINES)"
  for lang in "$S" "$T"; do
    head -n "$TRAIN_LINES" "$tmp/raw.train.$lang" > "$tmp/head.$lang"
    mv "$tmp/head.$lang" "$tmp/raw.train.$lang"
  done
fi
# The untouched test text: the reference for scoring, the source for inspection.
cp "$tmp/raw.test.$T" "$PREP_DIR/test.ref.$T"
cp "$tmp/raw.test.$S" "$PREP_DIR/test.raw.$S"

# ---- 2. normalise punctuation, tokenise ------------------------------------------------------
tokenize_flag=()
if [ "$SUBWORD" = bpe ]; then
  log "normalising punctuation and tokenising (sacremoses)"
else
  log "normalising punctuation (sacremoses; SentencePiece works on untokenised text)"
  tokenize_flag=(--no-tokenize)
fi
for split in train valid test; do
  for lang in "$S" "$T"; do
    "$PREPARE_TEXT" normalize --lang "$lang" --workers "$WORKERS" "${tokenize_flag[@]}" \
      "$tmp/raw.$split.$lang" "$tmp/tok.$split.$lang"
  done
done

# ---- 3. clean the training pairs -------------------------------------------------------------
log "cleaning training pairs: $MIN_LEN..$MAX_LEN tokens, length ratio <= $LEN_RATIO"
"$PREPARE_TEXT" clean --min-len "$MIN_LEN" --max-len "$MAX_LEN" --ratio "$LEN_RATIO" \
  --src-in "$tmp/tok.train.$S" --tgt-in "$tmp/tok.train.$T" \
  --src-out "$tmp/clean.train.$S" --tgt-out "$tmp/clean.train.$T"
for lang in "$S" "$T"; do
  mv "$tmp/tok.valid.$lang" "$tmp/clean.valid.$lang"
  mv "$tmp/tok.test.$lang" "$tmp/clean.test.$lang"
done

# ---- 4. subwords -----------------------------------------------------------------------------
if [ "$SUBWORD" = bpe ]; then
  log "learning joint BPE, $BPE_OPS merges (subword-nmt)"
  cat "$tmp/clean.train.$S" "$tmp/clean.train.$T" \
    | subword-nmt learn-bpe -s "$BPE_OPS" > "$tmp/bpe.codes"
  mv "$tmp/bpe.codes" "$PREP_DIR/bpe.codes"
  for split in train valid test; do
    for lang in "$S" "$T"; do
      log "applying BPE to $split.$lang"
      subword-nmt apply-bpe -c "$PREP_DIR/bpe.codes" --num-workers "$WORKERS" \
        < "$tmp/clean.$split.$lang" > "$tmp/sub.$split.$lang"
    done
  done
else
  log "training a joint SentencePiece model, $SPM_VOCAB pieces ($SPM_MODEL_TYPE)"
  "$PREPARE_TEXT" spm-train --model-prefix "$PREP_DIR/spm" --vocab-size "$SPM_VOCAB" \
    --model-type "$SPM_MODEL_TYPE" --input-sentence-size "$SPM_SAMPLE" \
    "$tmp/clean.train.$S" "$tmp/clean.train.$T"
  for split in train valid test; do
    for lang in "$S" "$T"; do
      "$PREPARE_TEXT" spm-encode --model "$PREP_DIR/spm.model" --workers "$WORKERS" \
        "$tmp/clean.$split.$lang" "$tmp/sub.$split.$lang"
    done
  done
fi

# ---- 5. check and finish ---------------------------------------------------------------------
for split in train valid test; do
  n=$("$PREPARE_TEXT" check-lines "$tmp/sub.$split.$S" "$tmp/sub.$split.$T") \
    || die "$split: the two sides lost their alignment"
  log "$split: $n pairs"
  mv "$tmp/sub.$split.$S" "$PREP_DIR/$split.$S"
  mv "$tmp/sub.$split.$T" "$PREP_DIR/$split.$T"
done
"$PREPARE_TEXT" check-lines "$PREP_DIR/test.$S" "$PREP_DIR/test.ref.$T" > /dev/null \
  || die "the test set and its reference differ in length"
# The text pipeline record (settings + the subword model's sha256): the model carries it, and the
# hub and the exports encode raw text by it.
"$PREPARE_TEXT" write-pipeline --source-lang "$S" --target-lang "$T" --subword "$SUBWORD" \
  --model "$PREP_DIR/${subword_outputs[0]}" --output "$PREP_DIR/text_pipeline.json"
rm -rf "$tmp"
step_mark_done "$PREP_DIR" "$config" "${raw_inputs[@]}" -- \
  "train.$S" "train.$T" "valid.$S" "valid.$T" "test.$S" "test.$T" \
  "test.ref.$T" "test.raw.$S" "${subword_outputs[@]}" text_pipeline.json
