#!/usr/bin/env bash
# Parsing step 2, binarize: fairseq-preprocess the prepared splits into $WORK_DIR/data-bin with
# two dictionaries: the source words (the paper's 16K vocabulary: the SRC_VOCAB most frequent
# training words, the others become <unk>; the output trees get the real words back) and the
# target brackets (every type: labelled brackets and XX). The vocabularies differ, so there is
# no joined dictionary and no --share-all-embeddings.
#
# Environment: SRC_VOCAB [16000], WORKERS [nproc], WORK_DIR (see settings.sh).
set -euo pipefail
STEP_NAME=binarize
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common.sh
source "$here/../common.sh"
activate_venv
# shellcheck source=settings.sh
source "$here/settings.sh"
SRC_VOCAB=${SRC_VOCAB:-16000}
WORKERS=${WORKERS:-$(num_cpus)}
require_int SRC_VOCAB
require_int WORKERS

config="v1 src_vocab=$SRC_VOCAB"
if step_is_done "$BIN_DIR" "$config" "$PREP_DIR"; then
  log "already done ($BIN_DIR/.done); skipping"
  exit 0
fi
require_step "$PREP_DIR" prepare
log "binarizing $PREP_DIR into $BIN_DIR (source vocabulary: the $SRC_VOCAB most frequent words)"
step_restart "$BIN_DIR"
run fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
  --trainpref "$PREP_DIR/train" --validpref "$PREP_DIR/valid" --testpref "$PREP_DIR/test" \
  --destdir "$BIN_DIR" --nwordssrc "$SRC_VOCAB" --workers "$WORKERS"
mapfile -t outputs < <(preprocess_outputs "$SRC" "$TGT")
log "dictionaries: $(wc -l < "$BIN_DIR/dict.$SRC.txt") source and $(wc -l < "$BIN_DIR/dict.$TGT.txt") target types (+4 special symbols)"
step_mark_done "$BIN_DIR" "$config" "$PREP_DIR" -- "${outputs[@]}"
