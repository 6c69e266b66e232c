#!/usr/bin/env bash
# Step 3, train (paper §5): the base or big Transformer with the paper's settings.
#
#   bash recipes/steps/train.sh PAIR        (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Checkpoints go to $RUN_DIR/checkpoints; fairseq-train's output goes to stdout and is appended
# to checkpoints/train.log.
#
# Paper settings (user_plugin/paper.py): shared source/target/output embeddings (§3.4); Adam
# with beta (0.9, 0.98), eps 1e-9 and the warm-up / inverse-square-root rate with 4000 warm-up
# steps (§5.3); label smoothing 0.1 (§5.4); 100k steps (base) or 300k (big) of about 25000
# source and 25000 target tokens (§5.1). fairseq's --max-tokens bounds each side of one batch,
# so the number of batches accumulated per step is
# --update-freq = ceil(TOKENS_PER_STEP / (MAX_TOKENS x training processes)).
#
# Environment (defaults in brackets; "paper" ones come from user_plugin/paper.py): WORK_DIR,
# MODEL [base|big], RUN_DIR [$WORK_DIR/$MODEL], DATA_BIN [$WORK_DIR/data-bin, the binarize
# step's; another fairseq-preprocess output of the pair is used as it is], ARCH [vaswani_base |
# the pair's big one], MAX_UPDATE [paper: 100000 | 300000], WARMUP_UPDATES [paper: 4000],
# LABEL_SMOOTHING [paper: 0.1], MAX_TOKENS [4096 per process], TOKENS_PER_STEP [paper: 25000],
# UPDATE_FREQ [computed], DEVICE [gpu when torch sees one, else cpu], NUM_GPUS [all visible],
# PRECISION [fp16 on GPU, fp32 on CPU; fp16|bf16|fp32], SAVE_INTERVAL_UPDATES [paper: 1500 |
# 600, every 10 minutes], AVERAGE_LAST [paper: 5 | 20: the interval checkpoints kept for the
# average step; 0: the run is not averaged, only the newest is kept and none is required],
# SEED [1], LOG_INTERVAL [100], TRAIN_TASK [translation], EXTRA_ARGS [none; more fairseq-train
# options, last so they win, e.g. a tiny model].
#
# Resuming: a finished run (its marker is valid) is skipped. An interrupted run continues from
# checkpoint_last.pt (fairseq does it by itself) when it was started with the same settings on
# the same data; otherwise, and when a finished run's settings, data or checkpoints changed,
# training starts over.
set -euo pipefail
STEP_NAME=train
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
model_defaults
detect_device
WARMUP_UPDATES=${WARMUP_UPDATES:-$PAPER_WARMUP_STEPS}
LABEL_SMOOTHING=${LABEL_SMOOTHING:-$PAPER_LABEL_SMOOTHING}
MAX_TOKENS=${MAX_TOKENS:-4096}
TOKENS_PER_STEP=${TOKENS_PER_STEP:-$PAPER_TOKENS_PER_STEP}
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
TRAIN_LOG="$CKPT_DIR/train.log"

# ---- the fairseq-train command line, built in parts -------------------------------------------

# runtime_args: RUNTIME_ARGS, fairseq-train's options for where and how the training processes
# run (device, precision, distributed training), and WORLD_SIZE, the number of processes that
# share each step.
runtime_args() {
  if [ "$DEVICE" = cpu ]; then
    WORLD_SIZE=1
    RUNTIME_ARGS=(--cpu)
  else
    # fairseq starts one process per GPU by itself.
    WORLD_SIZE=$NUM_GPUS
    RUNTIME_ARGS=(--distributed-world-size "$WORLD_SIZE")
  fi
  RUNTIME_ARGS+=("${PRECISION_ARGS[@]}")
}

# batch_args: BATCH_ARGS, the batch size: each step holds about TOKENS_PER_STEP source and as
# many target tokens (§5.1), MAX_TOKENS per batch in each of the WORLD_SIZE processes, times
# UPDATE_FREQ accumulated batches.
batch_args() {
  local per_pass=$(( MAX_TOKENS * WORLD_SIZE ))
  if [ -n "${UPDATE_FREQ:-}" ]; then
    require_int UPDATE_FREQ
    log "update-freq $UPDATE_FREQ (given)"
  else
    UPDATE_FREQ=$(( (TOKENS_PER_STEP + per_pass - 1) / per_pass ))
    log "update-freq = ceil($TOKENS_PER_STEP / ($MAX_TOKENS tokens x $WORLD_SIZE $DEVICE worker(s))) = $UPDATE_FREQ"
  fi
  log "tokens per step: up to $(( per_pass * UPDATE_FREQ )) source and as many target tokens (paper: ~$PAPER_TOKENS_PER_STEP each)"
  BATCH_ARGS=(--max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ"
              --required-batch-size-multiple 1)
}

# checkpoint_args: CHECKPOINT_ARGS, checkpoints every SAVE_INTERVAL_UPDATES updates, the last
# AVERAGE_LAST of them kept for the average step (the newest one when the run is not averaged).
checkpoint_args() {
  local keep=$(( AVERAGE_LAST > 0 ? AVERAGE_LAST : 1 ))
  CHECKPOINT_ARGS=(--save-dir "$CKPT_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES"
                   --keep-interval-updates "$keep" --no-epoch-checkpoints)
}

# log_args: LOG_ARGS, how fairseq-train reports progress.
log_args() {
  LOG_ARGS=(--log-format simple --log-interval "$LOG_INTERVAL")
}

# train_args: TRAIN_ARGS, the whole fairseq-train command line: the data, the paper's model,
# optimizer, learning rate and loss (§3.4, §5.3, §5.4), then the parts above and EXTRA_ARGS.
train_args() {
  local -a extra
  read -r -a extra <<< "$EXTRA_ARGS"
  runtime_args
  batch_args
  checkpoint_args
  log_args
  TRAIN_ARGS=(
    "$BIN_DIR" --user-dir "$PLUGIN_DIR" --task "$TRAIN_TASK" --source-lang "$S" --target-lang "$T"
    --arch "$ARCH" --share-all-embeddings
    --optimizer adam --adam-betas "$PAPER_ADAM_BETAS" --adam-eps "$PAPER_ADAM_EPS"
    --lr 1 --lr-scheduler vaswani_inverse_sqrt --warmup-updates "$WARMUP_UPDATES"
    --criterion vaswani_label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING"
    --max-update "$MAX_UPDATE" --seed "$SEED"
    "${BATCH_ARGS[@]}" "${CHECKPOINT_ARGS[@]}" "${LOG_ARGS[@]}" "${RUNTIME_ARGS[@]}"
    "${extra[@]}"
  )
}

# run_training: fairseq-train with TRAIN_ARGS, its output on stdout and appended to TRAIN_LOG.
run_training() {
  log "training $ARCH ($MODEL) on $DEVICE ($PRECISION) for $MAX_UPDATE updates into $CKPT_DIR"
  if ! run fairseq-train "${TRAIN_ARGS[@]}" 2>&1 | tee -a "$TRAIN_LOG"; then
    die "fairseq-train failed (exit ${PIPESTATUS[0]}); its output: $TRAIN_LOG"
  fi
  [ -f "$CKPT_DIR/checkpoint_last.pt" ] || die "fairseq-train wrote no $CKPT_DIR/checkpoint_last.pt"
}

# run_identity: CONFIG, the settings a finished or started run is recorded with (its
# fingerprint), and INPUTS, the upstream steps it reads. The data is the binarize step's output,
# identified by its marker; a DATA_BIN made elsewhere (no marker) is used as it is and
# identified by its path.
run_identity() {
  CONFIG="v1 $S-$T arch=$ARCH max_update=$MAX_UPDATE warmup=$WARMUP_UPDATES ls=$LABEL_SMOOTHING"
  CONFIG+=" max_tokens=$MAX_TOKENS update_freq=$UPDATE_FREQ device=$DEVICE gpus=$NUM_GPUS"
  CONFIG+=" precision=$PRECISION save=$SAVE_INTERVAL_UPDATES keep=$AVERAGE_LAST seed=$SEED"
  CONFIG+=" task=$TRAIN_TASK extra=$EXTRA_ARGS"
  if [ -n "${DATA_BIN:-}" ] && [ ! -f "$BIN_DIR/.done" ]; then
    INPUTS=()
    CONFIG+=" data=$BIN_DIR"
  else
    INPUTS=("$BIN_DIR")
  fi
}

# ---- the run --------------------------------------------------------------------------------
train_args
run_identity
if step_is_done "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}"; then
  log "training $ARCH: already done ($CKPT_DIR/.done, $MAX_UPDATE updates); skipping"
  exit 0
fi
if [ "${#INPUTS[@]}" -gt 0 ]; then
  require_step "$BIN_DIR" binarize
else
  require_data_bin "$BIN_DIR" train
  log "training on $BIN_DIR as it is (binarized outside the recipe)"
fi
if [ -f "$CKPT_DIR/.done" ]; then
  log "starting over in $CKPT_DIR"
  step_restart "$CKPT_DIR"
elif [ ! -f "$CKPT_DIR/checkpoint_last.pt" ]; then
  mkdir -p "$CKPT_DIR"
elif [ ! -f "$CKPT_DIR/.started" ]; then
  log "resuming from $CKPT_DIR/checkpoint_last.pt (no record of the settings it was trained with)"
elif step_can_continue "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}"; then
  log "resuming from $CKPT_DIR/checkpoint_last.pt"
else
  log "starting over in $CKPT_DIR"
  step_restart "$CKPT_DIR"
fi
step_begin "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}"

run_training
mapfile -t interval < <(cd "$CKPT_DIR" && ls checkpoint_[0-9]*_[0-9]*.pt 2>/dev/null || true)
if [ "$AVERAGE_LAST" -gt 0 ] && [ "${#interval[@]}" -eq 0 ]; then
  die "no interval checkpoints in $CKPT_DIR (run longer than SAVE_INTERVAL_UPDATES=$SAVE_INTERVAL_UPDATES)"
fi
log "interval checkpoints: ${interval[*]:-none}"
step_mark_done "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}" -- checkpoint_last.pt "${interval[@]}"
