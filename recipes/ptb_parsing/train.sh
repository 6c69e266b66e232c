#!/usr/bin/env bash
# Parsing step 3, train (paper §6.3): vaswani_parsing_wsj (4 layers, d_model 1024, otherwise the
# base model) with the plugin's task, criterion and schedule, as for translation: Adam (0.9,
# 0.98, 1e-9), warm-up / inverse square root rate (§5.3), label smoothing 0.1. Only dropout, the
# learning rate and the beam were tuned in the paper (on section 22): DROPOUT and LR_SCALE. The
# model is selected by section 22 loss (checkpoint_best.pt). The paper gives no step count for
# parsing: MAX_UPDATE defaults to the base model's 100k. An interrupted run resumes from
# checkpoint_last.pt when its settings and data are unchanged, and a run whose MAX_UPDATE alone
# was raised continues; new data starts it over; other settings are refused unless START_OVER=1
# (recipes/steps/train.sh, "Resuming").
#
# Environment (defaults in brackets): ARCH [vaswani_parsing_wsj], DROPOUT [0.1], LR_SCALE [1]
# (times equation 3), WARMUP_UPDATES [4000], LABEL_SMOOTHING [0.1], MAX_UPDATE [100000],
# MAX_TOKENS [4096 per GPU], TOKENS_PER_STEP [25000], UPDATE_FREQ [computed], DEVICE [gpu when
# torch sees one], NUM_GPUS [all], PRECISION [as recipes/steps/train.sh chooses], SEED [1],
# LOG_INTERVAL [100], EXTRA_ARGS [none; more fairseq-train options], START_OVER [0],
# WORK_DIR (settings.sh).
set -euo pipefail
STEP_NAME=train
# shellcheck source=settings.sh
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
detect_device
ARCH=${ARCH:-vaswani_parsing_wsj}
DROPOUT=${DROPOUT:-0.1}
LR_SCALE=${LR_SCALE:-1}
WARMUP_UPDATES=${WARMUP_UPDATES:-$PAPER_WARMUP_STEPS}
LABEL_SMOOTHING=${LABEL_SMOOTHING:-$PAPER_LABEL_SMOOTHING}
MAX_UPDATE=${MAX_UPDATE:-$PAPER_BASE_TRAIN_STEPS}
MAX_TOKENS=${MAX_TOKENS:-4096}
TOKENS_PER_STEP=${TOKENS_PER_STEP:-$PAPER_TOKENS_PER_STEP}
SEED=${SEED:-1}
LOG_INTERVAL=${LOG_INTERVAL:-100}
EXTRA_ARGS=${EXTRA_ARGS:-}
for name in WARMUP_UPDATES MAX_UPDATE MAX_TOKENS TOKENS_PER_STEP SEED LOG_INTERVAL; do
  require_int "$name"
done
require_flag START_OVER
[ "$MAX_TOKENS" -gt 0 ] || die "MAX_TOKENS must be positive"
workers=$(( NUM_GPUS > 0 ? NUM_GPUS : 1 ))
if [ -n "${UPDATE_FREQ:-}" ]; then
  require_int UPDATE_FREQ
else
  UPDATE_FREQ=$(( (TOKENS_PER_STEP + MAX_TOKENS * workers - 1) / (MAX_TOKENS * workers) ))
fi
device_args=(--cpu)
[ "$DEVICE" = gpu ] && device_args=(--distributed-world-size "$NUM_GPUS")
# shellcheck disable=SC2206
extra=($EXTRA_ARGS)

config="v1 arch=$ARCH dropout=$DROPOUT lr_scale=$LR_SCALE warmup=$WARMUP_UPDATES"
config+=" ls=$LABEL_SMOOTHING max_update=$MAX_UPDATE max_tokens=$MAX_TOKENS"
config+=" update_freq=$UPDATE_FREQ device=$DEVICE gpus=$NUM_GPUS precision=$PRECISION"
config+=" seed=$SEED extra=$EXTRA_ARGS"
if step_is_current "$CKPT_DIR" "$config" "$BIN_DIR"; then
  log "already done ($CKPT_DIR/.done); skipping"
  exit 0
fi
require_step "$BIN_DIR" binarize
begin_training "$CKPT_DIR" "$config" "$BIN_DIR"
log "training $ARCH on $DEVICE ($PRECISION): $MAX_UPDATE updates of up to $(( MAX_TOKENS * workers * UPDATE_FREQ )) tokens, dropout $DROPOUT, lr x $LR_SCALE"
run fairseq-train "$BIN_DIR" --user-dir "$PLUGIN_DIR" --task vaswani_translation \
  --source-lang "$SRC" --target-lang "$TGT" \
  --arch "$ARCH" --share-decoder-input-output-embed --dropout "$DROPOUT" \
  --optimizer adam --adam-betas "$PAPER_ADAM_BETAS" --adam-eps "$PAPER_ADAM_EPS" \
  --lr 1 --lr-scheduler vaswani_inverse_sqrt --lr-scale "$LR_SCALE" \
  --warmup-updates "$WARMUP_UPDATES" \
  --criterion vaswani_label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING" \
  --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE" \
  --required-batch-size-multiple 1 --save-dir "$CKPT_DIR" --no-epoch-checkpoints \
  --seed "$SEED" --log-format simple --log-interval "$LOG_INTERVAL" \
  "${device_args[@]}" "${PRECISION_ARGS[@]}" "${extra[@]}"
for name in checkpoint_last.pt checkpoint_best.pt; do
  [ -f "$CKPT_DIR/$name" ] || die "fairseq-train wrote no $CKPT_DIR/$name"
done
step_mark_done "$CKPT_DIR" "$config" "$BIN_DIR" -- checkpoint_last.pt checkpoint_best.pt
