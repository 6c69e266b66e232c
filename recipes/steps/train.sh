#!/usr/bin/env bash
# Step 3, train (paper §5): the base or big Transformer with the paper's settings, checkpoints in
# $WORK_DIR/$MODEL/checkpoints. Run through recipes/<pair>/train.sh.
#
# Paper settings: shared source/target/output embeddings (§3.4); Adam with beta (0.9, 0.98),
# eps 1e-9 and the warm-up / inverse-square-root rate with 4000 warm-up steps (§5.3); label
# smoothing 0.1 (§5.4); 100k steps (base) or 300k (big) of about 25000 source and 25000 target
# tokens (§5.1). fairseq's --max-tokens bounds each side of one batch, so the number of batches
# accumulated per step is --update-freq = ceil(TOKENS_PER_STEP / (MAX_TOKENS x GPUs)).
#
# Environment (defaults in brackets): WORK_DIR, MODEL [base|big], ARCH [vaswani_base |
# vaswani_big | vaswani_big_en_fr], MAX_UPDATE [100000 | 300000], WARMUP_UPDATES [4000],
# LABEL_SMOOTHING [0.1], MAX_TOKENS [4096 per GPU], TOKENS_PER_STEP [25000], UPDATE_FREQ
# [computed], DEVICE [gpu when torch sees one, else cpu], NUM_GPUS [all visible], PRECISION
# [fp16 on GPU, fp32 on CPU; fp16|bf16|fp32], SAVE_INTERVAL_UPDATES [1500 | 600: the paper's
# 10 minutes], AVERAGE_LAST [5 | 20; that many interval checkpoints are kept], SEED [1],
# LOG_INTERVAL [100], TRAIN_TASK [translation], EXTRA_ARGS [none; more fairseq-train options,
# e.g. a tiny model].
#
# Resuming: an interrupted run continues from checkpoint_last.pt (fairseq does it by itself).
# A finished run (its marker is valid) is skipped. When the data were prepared again, the
# settings changed or a checkpoint of a finished run went missing, training starts over.
set -euo pipefail
STEP_NAME=train
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# shellcheck disable=SC1090
source "${PAIR_CONFIG:?run recipes/<pair>/train.sh, which sets PAIR_CONFIG}"
activate_venv
setup_paths
model_defaults
detect_device
WARMUP_UPDATES=${WARMUP_UPDATES:-4000}
LABEL_SMOOTHING=${LABEL_SMOOTHING:-0.1}
MAX_TOKENS=${MAX_TOKENS:-4096}
TOKENS_PER_STEP=${TOKENS_PER_STEP:-25000}
SEED=${SEED:-1}
LOG_INTERVAL=${LOG_INTERVAL:-100}
TRAIN_TASK=${TRAIN_TASK:-translation}
EXTRA_ARGS=${EXTRA_ARGS:-}
for name in WARMUP_UPDATES MAX_TOKENS TOKENS_PER_STEP SEED LOG_INTERVAL; do
  require_int "$name"
done
[ "$MAX_TOKENS" -gt 0 ] || die "MAX_TOKENS must be positive"
[ "$SAVE_INTERVAL_UPDATES" -gt 0 ] || die "SAVE_INTERVAL_UPDATES must be positive (averaging needs interval checkpoints)"
S=$SRC_LANG
T=$TGT_LANG

# ---- batch size: ~25k source + ~25k target tokens per step (§5.1) -----------------------------
workers=$(( NUM_GPUS > 0 ? NUM_GPUS : 1 ))
per_pass=$(( MAX_TOKENS * workers ))
if [ -n "${UPDATE_FREQ:-}" ]; then
  require_int UPDATE_FREQ
  log "update-freq $UPDATE_FREQ (given)"
else
  UPDATE_FREQ=$(( (TOKENS_PER_STEP + per_pass - 1) / per_pass ))
  log "update-freq = ceil($TOKENS_PER_STEP / ($MAX_TOKENS tokens x $workers $DEVICE worker(s))) = $UPDATE_FREQ"
fi
log "tokens per step: up to $(( per_pass * UPDATE_FREQ )) source and as many target tokens (paper: ~25000 each)"

# fairseq's own distributed training: one process per GPU (it spawns them itself).
if [ "$DEVICE" = cpu ]; then
  device_args=(--cpu)
else
  device_args=(--distributed-world-size "$NUM_GPUS")
fi
# shellcheck disable=SC2206
extra=($EXTRA_ARGS)

config="v1 $S-$T arch=$ARCH max_update=$MAX_UPDATE warmup=$WARMUP_UPDATES ls=$LABEL_SMOOTHING"
config+=" max_tokens=$MAX_TOKENS update_freq=$UPDATE_FREQ device=$DEVICE gpus=$NUM_GPUS"
config+=" precision=$PRECISION save=$SAVE_INTERVAL_UPDATES keep=$AVERAGE_LAST seed=$SEED"
config+=" task=$TRAIN_TASK extra=$EXTRA_ARGS"
if step_is_done "$CKPT_DIR" "$config" "$BIN_DIR"; then
  log "already done ($CKPT_DIR/.done: $MAX_UPDATE updates); skipping"
  exit 0
fi
require_step "$BIN_DIR" binarize
if [ -f "$CKPT_DIR/.done" ]; then
  log "starting over in $CKPT_DIR"
  step_restart "$CKPT_DIR"
elif [ -f "$CKPT_DIR/checkpoint_last.pt" ]; then
  log "resuming from $CKPT_DIR/checkpoint_last.pt"
else
  mkdir -p "$CKPT_DIR"
fi

log "training $ARCH ($MODEL) on $DEVICE ($PRECISION) for $MAX_UPDATE updates into $CKPT_DIR"
run fairseq-train "$BIN_DIR" \
  --user-dir "$PLUGIN_DIR" --task "$TRAIN_TASK" --source-lang "$S" --target-lang "$T" \
  --arch "$ARCH" --share-all-embeddings \
  --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9 \
  --lr 1 --lr-scheduler vaswani_inverse_sqrt --warmup-updates "$WARMUP_UPDATES" \
  --criterion vaswani_label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING" \
  --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE" \
  --required-batch-size-multiple 1 \
  --save-dir "$CKPT_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES" \
  --keep-interval-updates "$AVERAGE_LAST" --no-epoch-checkpoints \
  --seed "$SEED" --log-format simple --log-interval "$LOG_INTERVAL" \
  "${device_args[@]}" "${PRECISION_ARGS[@]}" "${extra[@]}"

[ -f "$CKPT_DIR/checkpoint_last.pt" ] || die "fairseq-train wrote no $CKPT_DIR/checkpoint_last.pt"
mapfile -t interval < <(cd "$CKPT_DIR" && ls checkpoint_[0-9]*_[0-9]*.pt 2>/dev/null || true)
[ "${#interval[@]}" -gt 0 ] || die "no interval checkpoints in $CKPT_DIR (run longer than SAVE_INTERVAL_UPDATES=$SAVE_INTERVAL_UPDATES)"
log "interval checkpoints: ${interval[*]}"
step_mark_done "$CKPT_DIR" "$config" "$BIN_DIR" -- checkpoint_last.pt "${interval[@]}"
