#!/usr/bin/env bash
# The one-command parsing demo: a synthetic treebank from the project's grammar
# (user_plugin/parsing/synthetic_treebank.py), then the whole Penn Treebank recipe on it on a
# CPU: a small parser of the paper's kind (vaswani_parsing_wsj scaled down), decoded as the
# paper does (beam 21, alpha 0.3, input + 300), scored with EVALB's conventions. Prints F1 on
# the held-out synthetic test trees and the wall time.
#
#   recipes/ptb_parsing/demo.sh
#
# It first runs scripts/setup_venv.sh (SETUP_VENV=0 uses the current environment). Rerunning
# continues where it stopped; finished steps are skipped.
#
# Environment (defaults in brackets): WORK_DIR [work_dirs/demo_parsing], SETUP_VENV [1],
# SYNTH_TRAIN [6000], SYNTH_DEV [300], SYNTH_TEST [300], SYNTH_SEED [1], MAX_UPDATE [5000],
# MAX_TOKENS [2048], WARMUP_UPDATES [500], LR_SCALE [0.5], DROPOUT [0.1], DEMO_MODEL_ARGS
# [d_model 256, 3+3 layers, d_ff 1024, 4 heads], plus those of the steps (BEAM, LENPEN,
# POS_TAGS, ...).
set -euo pipefail
STEP_NAME=demo
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common.sh
source "$here/../common.sh"
start_time=$(date +%s)

if [ "${SETUP_VENV:-1}" = 1 ]; then
  log "setting up the virtual environment (scripts/setup_venv.sh)"
  bash "$REPO_DIR/scripts/setup_venv.sh"
fi
activate_venv

export WORK_DIR=${WORK_DIR:-$REPO_DIR/work_dirs/demo_parsing}
mkdir -p "$WORK_DIR"
WORK_DIR=$(cd "$WORK_DIR" && pwd)
SYNTH_TRAIN=${SYNTH_TRAIN:-6000}
SYNTH_DEV=${SYNTH_DEV:-300}
SYNTH_TEST=${SYNTH_TEST:-300}
SYNTH_SEED=${SYNTH_SEED:-1}
for name in SYNTH_TRAIN SYNTH_DEV SYNTH_TEST SYNTH_SEED; do
  require_int "$name"
done

# ---- the synthetic treebank, in the recipe's one-tree-per-line layout ------------------------
export PTB_DIR="$WORK_DIR/synthetic"
synth_config="v1 train=$SYNTH_TRAIN dev=$SYNTH_DEV test=$SYNTH_TEST seed=$SYNTH_SEED"
if step_is_done "$PTB_DIR" "$synth_config"; then
  log "synthetic treebank already in $PTB_DIR"
else
  step_restart "$PTB_DIR"
  run vaswani-prepare-trees synthesize --out-dir "$PTB_DIR" \
    --train "$SYNTH_TRAIN" --dev "$SYNTH_DEV" --test "$SYNTH_TEST" --seed "$SYNTH_SEED"
  step_mark_done "$PTB_DIR" "$synth_config" -- train.trees dev.trees test.trees
fi

# ---- the demo's model and schedule (the paper's recipe, scaled down for a CPU) ---------------
export DEVICE=cpu PRECISION=fp32 GEN_SUBSET=test
export MAX_UPDATE=${MAX_UPDATE:-5000}
export MAX_TOKENS=${MAX_TOKENS:-2048}
export TOKENS_PER_STEP=${TOKENS_PER_STEP:-$MAX_TOKENS}
export WARMUP_UPDATES=${WARMUP_UPDATES:-500}
export LR_SCALE=${LR_SCALE:-0.5}
export DROPOUT=${DROPOUT:-0.1}
export LOG_INTERVAL=${LOG_INTERVAL:-100}
DEMO_MODEL_ARGS=${DEMO_MODEL_ARGS:-"--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4"}
export EXTRA_ARGS="$DEMO_MODEL_ARGS ${EXTRA_ARGS:-}"
log "synthetic treebank: $SYNTH_TRAIN train, $SYNTH_DEV dev, $SYNTH_TEST test trees (seed $SYNTH_SEED)"
log "model: vaswani_parsing_wsj with $DEMO_MODEL_ARGS; $MAX_UPDATE updates of <= $MAX_TOKENS tokens, lr x $LR_SCALE"

bash "$here/run_all.sh"

elapsed=$(( $(date +%s) - start_time ))
# shellcheck source=settings.sh
source "$here/settings.sh"
f1=$(json_value "$SCORE_DIR/evalb.json" all f1)
log "synthetic held-out test trees ($SYNTH_TEST): bracket F1 $f1 (EVALB conventions); wall time ${elapsed}s"
log "parsed trees: $WORK_DIR/generate/test/parsed.trees; EVALB report: $WORK_DIR/score/test/evalb.txt"
