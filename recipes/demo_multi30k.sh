#!/usr/bin/env bash
# The one-command demo: a small Transformer trained on Multi30k English->German on a CPU, then
# checkpoint averaging, beam search (the paper's beam and length penalty, §6.1) on
# test_2016_flickr and sacreBLEU, and the model package $RUN_DIR/model (model, dictionaries,
# subword model, manifest with the scores, model card) that every command takes. It runs the steps of the language pair wmt14_en_de
# (recipes/run_all.sh) on Multi30k (train / val / test_2016_flickr) with a model and schedule of
# its own, scaled down for 2 CPU cores.
#
#   bash recipes/demo_multi30k.sh
#
# While training, every LOG_INTERVAL updates a progress line says how far the run is (update
# n / N, elapsed, time left, loss, lr); the checkpoints that are averaged (the last AVERAGE_LAST)
# are validated on Multi30k's val set: their loss (checkpoint_best.pt is the checkpoint of lowest
# validation loss), and, with EVAL_BLEU=1, their BLEU with the paper's decoding (beam 4, GNMT
# alpha 0.6, through the task vaswani_translation; checkpoint_best.pt is then the one of best
# BLEU). The decoding is what a validation costs (14-20 s on 2 cores, the loss alone 2-3 s), so
# the demo leaves it off: the BLEU it reports is the test BLEU of the average of those
# checkpoints (the paper's, §6.1), not that of checkpoint_best.pt. TensorBoard logs:
# $RUN_DIR/checkpoints/tensorboard; training curves: $RUN_DIR/checkpoints/training_curves.png.
#
# It first runs scripts/setup_venv.sh (creates .venv once; without the test suite's tools, which
# scripts/run_tests.sh adds). Multi30k is read from MULTI30K_DIR
# (default ../shared/data/multi30k-en-de) or, when that folder is absent, downloaded from the
# multi30k/dataset GitHub repository (pinned commit; every file checked against its sha256).
# Rerunning continues where it stopped; finished steps are skipped.
#
# Environment (defaults in brackets): WORK_DIR [work_dirs/demo_multi30k], MULTI30K_DIR,
# SETUP_VENV [1; 0: use the current environment as it is], PRECISION [bf16 where the CPU has
# AVX-512 bf16 or AMX, else fp32: see docs/recipes.md], ARCH [vaswani_base; transformer:
# fairseq's own, as recipes/parity_multi30k.sh trains it], RUN_DIR [$WORK_DIR/base], BPE_OPS
# [5000: about 5,100 joint types], MAX_UPDATE [1800], MAX_TOKENS [2048], WARMUP_UPDATES [800],
# SAVE_INTERVAL_UPDATES [100], LOG_INTERVAL [50], EVAL_BLEU [0: validation loss only; 1: and
# BLEU], GEN_MAX_TOKENS [2048: the test set's decoding batches, the fastest on 2 cores],
# DEMO_MODEL_ARGS [d_model 256, 3+3 layers, d_ff 1024, 4 heads, dropout 0.1], plus those of
# recipes/steps/*.sh (TRAIN_TASK [here vaswani_translation], AVERAGE_LAST [the paper's base: 5],
# SEED [1], TASK, BEAM, ...).
set -euo pipefail
STEP_NAME=demo
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=downloads.sh
source "$RECIPES_DIR/downloads.sh"
start_time=$(date +%s)

SETUP_VENV=${SETUP_VENV:-1}
if [ "$SETUP_VENV" = 1 ]; then
  log "setting up the virtual environment (scripts/setup_venv.sh)"
  EXTRAS="" bash "$REPO_DIR/scripts/setup_venv.sh"
else
  log "SETUP_VENV=$SETUP_VENV: using the current environment as it is"
fi
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
# The vocabulary is scaled down with the data (29,000 pairs against the paper's 4.5 million and
# 37,000 types): the output projection and the loss grow with it, and 5,000 merges train the
# demo 1.1x faster per update than 8,000 at the same BLEU within a seed's spread
# (docs/recipes.md).
export BPE_OPS=${BPE_OPS:-5000}
export MODEL=base DEVICE=cpu
export ARCH=${ARCH:-vaswani_base}
export RUN_DIR=${RUN_DIR:-$WORK_DIR/$MODEL}
unset DATA_BIN             # the data steps' default layout below WORK_DIR
export TEST_SET_NAME=${TEST_SET_NAME:-Multi30k test_2016_flickr}
export MAX_UPDATE=${MAX_UPDATE:-1800}
export MAX_TOKENS=${MAX_TOKENS:-2048}
export TOKENS_PER_STEP=${TOKENS_PER_STEP:-$MAX_TOKENS}
export WARMUP_UPDATES=${WARMUP_UPDATES:-800}
export SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-100}
export LOG_INTERVAL=${LOG_INTERVAL:-50}
EVAL_BLEU=${EVAL_BLEU:-0}
export GEN_MAX_TOKENS=${GEN_MAX_TOKENS:-2048}
DEMO_MODEL_ARGS=${DEMO_MODEL_ARGS:-"--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1"}
# Validation runs only at the checkpoints that are averaged (the last AVERAGE_LAST), not at the
# end of each epoch (--validate-interval beyond the run's epochs); no later, since fairseq saves
# the interval checkpoints only from --validate-after-updates on. With EVAL_BLEU=1 it also decodes
# BLEU as the paper does (§6.1) through the task vaswani_translation; the BPE-split,
# Moses-tokenized hypotheses and references lose the BPE and are Moses-detokenized before
# sacreBLEU. No spaces inside the JSON: EXTRA_ARGS is split on whitespace. Either way the run
# trains with the task vaswani_translation, whose batches never drop a sentence.
export TRAIN_TASK=${TRAIN_TASK:-vaswani_translation}
AVERAGE_LAST=${AVERAGE_LAST:-$PAPER_BASE_AVERAGE_LAST}
require_int MAX_UPDATE; require_int AVERAGE_LAST; require_int SAVE_INTERVAL_UPDATES
VALIDATE_FROM=$(( MAX_UPDATE - (AVERAGE_LAST - 1) * SAVE_INTERVAL_UPDATES ))
[ "$VALIDATE_FROM" -ge 0 ] || VALIDATE_FROM=0  # a run shorter than the averaged span
VALIDATION_ARGS="--validate-interval 1000 --validate-after-updates $VALIDATE_FROM"
case "$EVAL_BLEU" in
  1)
    VALIDATION_ARGS+=" --eval-bleu --eval-bleu-args {\"beam\":$PAPER_BEAM,\"lenpen\":$PAPER_LENPEN}"
    VALIDATION_ARGS+=" --eval-bleu-remove-bpe --eval-bleu-detok moses"
    VALIDATION_ARGS+=" --eval-bleu-detok-args {\"target_lang\":\"de\"}"
    VALIDATION_ARGS+=" --best-checkpoint-metric bleu --maximize-best-checkpoint-metric"
    ;;
  0) ;;
  *) die "EVAL_BLEU must be 1 or 0, got '$EVAL_BLEU'" ;;
esac
# Equation 3's d_model is the model's width: stated, since fairseq's built-in transformer
# does not hand its width to the scheduler as ours does.
SCHEDULE_ARGS=""
if [[ " $DEMO_MODEL_ARGS " =~ \ --decoder-embed-dim\ ([0-9]+)\  ]]; then
  SCHEDULE_ARGS="--d-model ${BASH_REMATCH[1]}"
fi
export EXTRA_ARGS="$DEMO_MODEL_ARGS $SCHEDULE_ARGS $VALIDATION_ARGS ${EXTRA_ARGS:-}"
log "Multi30k demo in $WORK_DIR: BPE $BPE_OPS merges; $ARCH, $MAX_UPDATE updates of <= $MAX_TOKENS tokens, into $RUN_DIR"
log "model: $DEMO_MODEL_ARGS"
if [ "$EVAL_BLEU" = 1 ]; then
  log "validation loss and BLEU (beam $PAPER_BEAM, alpha $PAPER_LENPEN) every $SAVE_INTERVAL_UPDATES updates from update $VALIDATE_FROM"
else
  log "validation loss every $SAVE_INTERVAL_UPDATES updates from update $VALIDATE_FROM (EVAL_BLEU=1 adds BLEU, about 15 s each)"
fi

bash "$RECIPES_DIR/run_all.sh" wmt14_en_de

# what the package says it is: its test score, and the checkpoints its model averages
scored=$(python - "$RUN_DIR/model" <<'EOF'
import sys

from user_plugin.artifacts.package import read_package

manifest = read_package(sys.argv[1])
bleu = manifest["scores"]["sacrebleu"]
averaged = [name for entry in manifest["origin"]["checkpoints"]
            for name in entry.get("averaged_from", [entry["checkpoint"]])]
plural = "s" if len(averaged) != 1 else ""
print(f"the average of {len(averaged)} checkpoint{plural} ({', '.join(averaged)}): "
      f"{bleu['score']:.1f} ({bleu['signature']})")
EOF
)
elapsed=$(( $(date +%s) - start_time ))
log "Multi30k test_2016_flickr EN->DE sacreBLEU of $scored"
log "validation: $(vaswani-plot-training "$RUN_DIR/checkpoints/train.log" --summary 2>&1)"
log "training curves: $RUN_DIR/checkpoints/training_curves.png"
log "TensorBoard: tensorboard --logdir $RUN_DIR/checkpoints/tensorboard"
log "translations: $RUN_DIR/generate/hyp.detok.de; wall time ${elapsed}s"
log "the model package: $RUN_DIR/model (echo 'A dog runs.' | vaswani-translate $RUN_DIR/model)"
