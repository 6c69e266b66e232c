#!/usr/bin/env bash
# The one-command demo: a small Transformer trained on Multi30k English->German on a CPU, then
# checkpoint averaging, beam search (the paper's beam and length penalty, §6.1) on
# test_2016_flickr and sacreBLEU. It runs the steps of the language pair wmt14_en_de
# (recipes/run_all.sh) on Multi30k (train / val / test_2016_flickr) with a model and schedule of
# its own, scaled down for 2 CPU cores.
#
#   bash recipes/demo_multi30k.sh
#
# It first runs scripts/setup_venv.sh (creates .venv once). Multi30k is read from MULTI30K_DIR
# (default ../shared/data/multi30k-en-de) or, when that folder is absent, downloaded from the
# multi30k/dataset GitHub repository (pinned commit; every file checked against its sha256).
# Rerunning continues where it stopped; finished steps are skipped.
#
# Environment (defaults in brackets): WORK_DIR [work_dirs/demo_multi30k], MULTI30K_DIR,
# BPE_OPS [8000], MAX_UPDATE [1800], MAX_TOKENS [2048], WARMUP_UPDATES [800],
# SAVE_INTERVAL_UPDATES [100], DEMO_MODEL_ARGS [d_model 256, 3+3 layers, d_ff 1024, 4 heads,
# dropout 0.1], plus those of recipes/steps/*.sh (AVERAGE_LAST [the paper's base: 5], TASK,
# BEAM, ...).
set -euo pipefail
STEP_NAME=demo
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
start_time=$(date +%s)

log "setting up the virtual environment (scripts/setup_venv.sh)"
bash "$REPO_DIR/scripts/setup_venv.sh"
activate_venv

MULTI30K_DIR=${MULTI30K_DIR:-$REPO_DIR/../shared/data/multi30k-en-de}
export WORK_DIR=${WORK_DIR:-$REPO_DIR/work_dirs/demo_multi30k}
mkdir -p "$WORK_DIR"
MULTI30K_COMMIT=a3d2e0d26b56f3846f66a952536ffed4e401d05a
MULTI30K_URL=https://raw.githubusercontent.com/multi30k/dataset/$MULTI30K_COMMIT/data/task1/raw
# "name|sha256 of the uncompressed file" (as listed in shared/data/multi30k-en-de/README.md)
MULTI30K_FILES=(
  "train.en|460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"
  "train.de|2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"
  "val.en|1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"
  "val.de|660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"
  "test_2016_flickr.en|399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182"
  "test_2016_flickr.de|4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16"
)

# ---- Multi30k as the recipe's RAW_DIR layout -------------------------------------------------
export RAW_DIR="$WORK_DIR/raw"
if [ ! -d "$MULTI30K_DIR" ]; then
  log "$MULTI30K_DIR not found: downloading Multi30k from github.com/multi30k/dataset"
  MULTI30K_DIR="$WORK_DIR/multi30k-download"
  mkdir -p "$MULTI30K_DIR"
  for entry in "${MULTI30K_FILES[@]}"; do
    name=${entry%%|*}
    if [ ! -f "$MULTI30K_DIR/$name" ]; then
      download "$MULTI30K_URL/$name.gz" "$MULTI30K_DIR/$name.gz"
      gunzip -c "$MULTI30K_DIR/$name.gz" > "$MULTI30K_DIR/$name.tmp"
      mv "$MULTI30K_DIR/$name.tmp" "$MULTI30K_DIR/$name"
    fi
  done
fi
MULTI30K_DIR=$(cd "$MULTI30K_DIR" && pwd)
if ! step_is_done "$RAW_DIR" "v1 $MULTI30K_DIR"; then
  log "copying Multi30k from $MULTI30K_DIR (train, val -> valid, test_2016_flickr -> test)"
  step_restart "$RAW_DIR"
  for entry in "${MULTI30K_FILES[@]}"; do
    name=${entry%%|*}
    sha=${entry##*|}
    [ -f "$MULTI30K_DIR/$name" ] || die "$MULTI30K_DIR/$name is missing"
    [ "$(sha256sum "$MULTI30K_DIR/$name" | cut -d' ' -f1)" = "$sha" ] \
      || die "$MULTI30K_DIR/$name: sha256 differs from the Multi30k release"
    split=${name%.*}
    case "$split" in val) split=valid ;; test_2016_flickr) split=test ;; esac
    cp "$MULTI30K_DIR/$name" "$RAW_DIR/$split.${name##*.}"
  done
  step_mark_done "$RAW_DIR" "v1 $MULTI30K_DIR" -- \
    train.en train.de valid.en valid.de test.en test.de
fi

# ---- the demo's model and schedule (paper's recipe, scaled down for 2 CPU cores) -------------
export BPE_OPS=${BPE_OPS:-8000}
export MODEL=base DEVICE=cpu PRECISION=fp32
unset RUN_DIR DATA_BIN     # the steps' default layout below WORK_DIR, read back at the end
export MAX_UPDATE=${MAX_UPDATE:-1800}
export MAX_TOKENS=${MAX_TOKENS:-2048}
export TOKENS_PER_STEP=${TOKENS_PER_STEP:-$MAX_TOKENS}
export WARMUP_UPDATES=${WARMUP_UPDATES:-800}
export SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-100}
export LOG_INTERVAL=${LOG_INTERVAL:-50}
DEMO_MODEL_ARGS=${DEMO_MODEL_ARGS:-"--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1"}
export EXTRA_ARGS="$DEMO_MODEL_ARGS ${EXTRA_ARGS:-}"
log "Multi30k demo in $WORK_DIR: BPE $BPE_OPS merges, $MAX_UPDATE updates of <= $MAX_TOKENS tokens"
log "model: $DEMO_MODEL_ARGS"

bash "$RECIPES_DIR/run_all.sh" wmt14_en_de

sacrebleu=$(python - "$WORK_DIR/$MODEL/score/bleu.json" <<'EOF'
import json
import sys

with open(sys.argv[1], encoding="utf-8") as handle:
    scores = json.load(handle)
print(f"{scores['sacrebleu']['score']:.1f} ({scores['sacrebleu']['signature']})")
EOF
)
elapsed=$(( $(date +%s) - start_time ))
log "Multi30k test_2016_flickr EN->DE sacreBLEU: $sacrebleu"
log "translations: $WORK_DIR/$MODEL/generate/hyp.detok.de; wall time ${elapsed}s"
