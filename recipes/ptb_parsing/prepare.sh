#!/usr/bin/env bash
# Parsing step 1, prepare (paper §6.3): read the Penn Treebank in PTB_DIR, normalize the trees
# (no -NONE- elements, empty constituents, function tags or indices; POS tags kept) and write,
# per split, the words (source), the linearized trees (target, Vinyals et al. 2015) and the
# normalized gold trees into $WORK_DIR/prepared. Every file is read and checked before anything
# is written: a bad PTB_DIR is one error line, before any training.
#
# Environment:
#   PTB_DIR   (required) wsj/SS/wsj_SSNN.mrg (sections 02-21 train, 22 dev, 23 test), or
#             train.trees, dev.trees, test.trees with one tree per line
#   POS_TAGS  [keep] keep: the target holds the part-of-speech tags, which the model predicts
#             (as the paper's tensor2tensor implementation); xx: every tag is written as XX
#             (Vinyals et al.), and parsed trees take the gold tags
#   WORK_DIR  see settings.sh
set -euo pipefail
STEP_NAME=prepare
# shellcheck source=settings.sh
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
POS_TAGS=${POS_TAGS:-keep}
case "$POS_TAGS" in
  xx|keep) ;;
  *) die "POS_TAGS must be xx or keep, got '$POS_TAGS'" ;;
esac
[ -n "${PTB_DIR:-}" ] || die "PTB_DIR is not set: point it at a Penn Treebank (wsj/SS/wsj_SSNN.mrg, or train.trees, dev.trees, test.trees)"
[ -d "$PTB_DIR" ] || die "PTB_DIR $PTB_DIR: no such directory"
PTB_DIR=$(cd "$PTB_DIR" && pwd)

config="v1 ptb=$PTB_DIR pos_tags=$POS_TAGS"
skip_step_if_done "$PREP_DIR" "$config"
log "reading and normalizing the treebank in $PTB_DIR (POS tags: $POS_TAGS)"
step_restart "$PREP_DIR"
run "$PREPARE_TREES" prepare --ptb-dir "$PTB_DIR" --out-dir "$PREP_DIR" \
  --pos-tags "$POS_TAGS"
outputs=(prepare.json)
for split in train valid test; do
  outputs+=("$split.$SRC" "$split.$TGT" "$split.gold")
done
step_mark_done "$PREP_DIR" "$config" -- "${outputs[@]}"
