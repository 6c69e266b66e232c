#!/usr/bin/env bash
# Step 3, train (paper §5): the base or big Transformer with the paper's settings.
#
#   bash recipes/steps/train.sh PAIR        (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Checkpoints go to $RUN_DIR/checkpoints; fairseq-train's output goes to stdout and is appended
# to checkpoints/train.log, with a progress line (update n / N, elapsed, time left) every
# LOG_INTERVAL updates; TensorBoard logs go to checkpoints/tensorboard, and the training curves
# to checkpoints/training_curves.png when training ends.
#
# Paper settings (user_plugin/paper.py): shared source/target/output embeddings (§3.4); Adam
# with beta (0.9, 0.98), eps 1e-9 and the warm-up / inverse-square-root rate with 4000 warm-up
# steps (§5.3); label smoothing 0.1 (§5.4); 100k steps (base) or 300k (big) of about 25000
# source and 25000 target tokens (§5.1). fairseq's --max-tokens bounds each side of one batch,
# so the number of batches accumulated per step is
# --update-freq = ceil(TOKENS_PER_STEP / (MAX_TOKENS x training processes)), the processes of
# all nodes counted (one per GPU; one per node on CPU), and the batches then share the step
# evenly: --max-tokens = ceil(TOKENS_PER_STEP / (update-freq x processes)) <= MAX_TOKENS.
#
# Environment (defaults in brackets; "paper" ones come from user_plugin/paper.py): WORK_DIR,
# MODEL [base|big], RUN_DIR [$WORK_DIR/$MODEL], DATA_BIN [$WORK_DIR/data-bin, the binarize
# step's; another fairseq-preprocess output of the pair is used as it is], ARCH [vaswani_base |
# the pair's big one], MAX_UPDATE [paper: 100000 | 300000], WARMUP_UPDATES [paper: 4000],
# LABEL_SMOOTHING [paper: 0.1], MAX_TOKENS [4096: a batch's bound], TOKENS_PER_STEP [paper: 25000],
# UPDATE_FREQ [computed], DEVICE [gpu when torch sees one, else cpu], NUM_GPUS [all visible:
# GPUs per node], PRECISION [GPU: bf16 with compute capability >= 8, else fp16; CPU: bf16 where
# it has AVX-512 bf16 or AMX, else fp32; fp16|bf16|fp32], NNODES [1, or Slurm's SLURM_NNODES], NODE_RANK [0, or
# SLURM_NODEID], MASTER_ADDR [node 0's address; under Slurm the first host of
# SLURM_JOB_NODELIST], MASTER_PORT [29500; under Slurm 20000 + SLURM_JOB_ID mod 40000],
# SAVE_INTERVAL_UPDATES [paper: 1500 | 600, every 10 minutes], AVERAGE_LAST [paper: 5 | 20:
# the interval checkpoints kept for the average step; 0: the run is not averaged, only the
# newest is kept and none is required],
# SEED [1], OPTIMIZER [the device's default: user_plugin/training_defaults.py, adam on a GPU,
# vaswani_adam on a CPU; adam: fairseq's; vaswani_adam: the same update as one fused operation,
# user_plugin/optimizers], LOG_INTERVAL [100], TRAIN_TASK [translation], TENSORBOARD_DIR
# [$RUN_DIR/checkpoints/tensorboard; none: no TensorBoard logs], CURVES_PNG
# [$RUN_DIR/checkpoints/training_curves.png, drawn when training ends], EXTRA_ARGS [none; more
# fairseq-train options, last so they win, e.g. a tiny model], START_OVER [0; 1: a changed
# setting starts the run over, deleting its checkpoints, instead of being refused].
#
# Several nodes (NNODES > 1): run this script on every node with the same settings and its own
# NODE_RANK (under Slurm: `srun --nodes N --ntasks-per-node 1 bash recipes/steps/train.sh PAIR`).
# Each node joins fairseq's rendezvous at tcp://MASTER_ADDR:MASTER_PORT with
# --distributed-world-size (all processes) and --distributed-rank (the node's first rank);
# fairseq starts one process per GPU itself. On CPU each node is one process (gloo,
# --distributed-no-spawn, --ddp-backend legacy_ddp), so that the same path runs in CI as two
# local "nodes". RUN_DIR and DATA_BIN must be on a filesystem all nodes share (fairseq looks
# for checkpoint_last.pt on every rank; rank 0 reads it and sends it to the others). Node 0
# owns the step's directory: its markers, restarts and train.log; another node only trains and
# logs to $RUN_DIR/train.node<NODE_RANK>.log.
#
# Resuming (docs/recipes.md, "Steps"): a finished run (its marker is valid) is skipped. An
# interrupted run continues from its newest intact checkpoint (the plugin and fairseq do it by
# themselves) when it was started with the same settings on the same data (recorded in
# checkpoints/.started). A finished or interrupted run whose MAX_UPDATE alone was raised
# continues from its last checkpoint to the new MAX_UPDATE: its checkpoints are kept (the last
# AVERAGE_LAST interval ones of the whole run, as one longer run keeps them). When the data
# changed, or the checkpoints have no record (a deleted marker), training starts over from
# scratch, saying why. Any other change (another setting, a lowered MAX_UPDATE, a finished
# run's checkpoint lost) would delete the checkpoints: it is refused in one line unless
# START_OVER=1 [0] asks to start over. A directory that a training run is still using is never
# emptied.
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
OPTIMIZER=${OPTIMIZER:-$DEVICE_OPTIMIZER}
case "$OPTIMIZER" in
  adam|vaswani_adam) ;;
  *) die "OPTIMIZER must be adam (fairseq's) or vaswani_adam (the plugin's), got '$OPTIMIZER'" ;;
esac
LOG_INTERVAL=${LOG_INTERVAL:-100}
TRAIN_TASK=${TRAIN_TASK:-translation}
EXTRA_ARGS=${EXTRA_ARGS:-}
for name in WARMUP_UPDATES MAX_TOKENS TOKENS_PER_STEP SEED LOG_INTERVAL; do
  require_int "$name"
done
require_flag START_OVER
[ "$MAX_UPDATE" -gt 0 ] || die "MAX_UPDATE must be positive (fairseq-train reads 0 as no limit)"
[ "$MAX_TOKENS" -gt 0 ] || die "MAX_TOKENS must be positive"
[ "$TOKENS_PER_STEP" -gt 0 ] || die "TOKENS_PER_STEP must be positive"
[ "$SAVE_INTERVAL_UPDATES" -gt 0 ] || die "SAVE_INTERVAL_UPDATES must be positive (averaging needs interval checkpoints)"
S=$SRC_LANG
T=$TGT_LANG
TRAIN_LOG="$CKPT_DIR/train.log"
TENSORBOARD_DIR=${TENSORBOARD_DIR:-$CKPT_DIR/tensorboard}
CURVES_PNG=${CURVES_PNG:-$CKPT_DIR/training_curves.png}

# ---- the fairseq-train command line, built in parts -------------------------------------------

# node_settings: NNODES, NODE_RANK and, with several nodes, MASTER_ADDR and MASTER_PORT (node
# 0's rendezvous), from the environment, else from Slurm's (one task per node).
node_settings() {
  NNODES=${NNODES:-${SLURM_NNODES:-1}}
  NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
  require_int NNODES
  require_int NODE_RANK
  [ "$NNODES" -ge 1 ] || die "NNODES must be at least 1"
  [ "$NODE_RANK" -lt "$NNODES" ] || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
  [ "$NNODES" -gt 1 ] || return 0
  if [ -z "${MASTER_ADDR:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] \
      && command -v scontrol >/dev/null 2>&1; then
    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')
  fi
  [ -n "${MASTER_ADDR:-}" ] \
    || die "NNODES=$NNODES: set MASTER_ADDR to node 0's address (reachable from every node)"
  if [ -z "${MASTER_PORT:-}" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    require_int SLURM_JOB_ID
    MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 40000 ))  # the same on every node of the job
  fi
  MASTER_PORT=${MASTER_PORT:-29500}
  require_int MASTER_PORT
}

# runtime_args: RUNTIME_ARGS, fairseq-train's options for where and how the training processes
# run (device, precision, distributed training), and WORLD_SIZE, the number of processes that
# share each step: NNODES x PROCS_PER_NODE (one per GPU, fairseq starts them; one on CPU).
runtime_args() {
  local first_rank
  node_settings
  if [ "$DEVICE" = cpu ]; then
    PROCS_PER_NODE=1
    RUNTIME_ARGS=(--cpu)
  else
    PROCS_PER_NODE=$NUM_GPUS
    RUNTIME_ARGS=()
  fi
  WORLD_SIZE=$(( NNODES * PROCS_PER_NODE ))
  if [ "$NNODES" -gt 1 ]; then
    first_rank=$(( NODE_RANK * PROCS_PER_NODE ))
    log "node $NODE_RANK of $NNODES: rank(s) $first_rank..$(( first_rank + PROCS_PER_NODE - 1 ))" \
        "of $WORLD_SIZE, rendezvous tcp://$MASTER_ADDR:$MASTER_PORT"
    RUNTIME_ARGS+=(--distributed-world-size "$WORLD_SIZE" --distributed-rank "$first_rank"
                   --distributed-init-method "tcp://$MASTER_ADDR:$MASTER_PORT")
    if [ "$DEVICE" = cpu ]; then
      RUNTIME_ARGS+=(--distributed-backend gloo --distributed-no-spawn --ddp-backend legacy_ddp)
    elif [ "$NUM_GPUS" -lt "$VISIBLE_GPUS" ]; then
      # fairseq starts a process for each visible GPU (at most the world size): show it NUM_GPUS
      restrict_visible_gpus "$NUM_GPUS"
    fi
  elif [ "$DEVICE" = gpu ]; then
    RUNTIME_ARGS+=(--distributed-world-size "$WORLD_SIZE")
  fi
  RUNTIME_ARGS+=("${PRECISION_ARGS[@]}")
}

# restrict_visible_gpus N: CUDA_VISIBLE_DEVICES lists only the first N of the visible GPUs.
restrict_visible_gpus() {
  local -a ids
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
  else
    mapfile -t ids < <(seq 0 $(( VISIBLE_GPUS - 1 )))
  fi
  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${ids[*]:0:$1}")
  export CUDA_VISIBLE_DEVICES
  log "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES (NUM_GPUS=$1)"
}

# batch_args: BATCH_ARGS, the batch size: each step holds about TOKENS_PER_STEP source and as
# many target tokens (§5.1): UPDATE_FREQ accumulated batches in each of the WORLD_SIZE processes,
# each of at most BATCH_TOKENS tokens. UPDATE_FREQ (unless given) is the least number of
# batches of at most MAX_TOKENS that make up the step; BATCH_TOKENS then shares the step evenly,
# ceil(TOKENS_PER_STEP / (UPDATE_FREQ x WORLD_SIZE)) <= MAX_TOKENS, so that with many workers
# (8 GPUs: 8 x 4096 = 32768) a step does not grow past the paper's.
batch_args() {
  local per_pass=$(( MAX_TOKENS * WORLD_SIZE ))
  BATCH_TOKENS=$MAX_TOKENS
  if [ -n "${UPDATE_FREQ:-}" ]; then
    require_int UPDATE_FREQ
    [ "$UPDATE_FREQ" -gt 0 ] || die "UPDATE_FREQ must be positive"
    log "update-freq $UPDATE_FREQ (given)"
  else
    UPDATE_FREQ=$(( (TOKENS_PER_STEP + per_pass - 1) / per_pass ))
    log "update-freq = ceil($TOKENS_PER_STEP / ($MAX_TOKENS tokens x $WORLD_SIZE $DEVICE worker(s))) = $UPDATE_FREQ"
    per_pass=$(( UPDATE_FREQ * WORLD_SIZE ))
    BATCH_TOKENS=$(( (TOKENS_PER_STEP + per_pass - 1) / per_pass ))
    if [ "$BATCH_TOKENS" -lt "$MAX_TOKENS" ]; then
      log "max-tokens = ceil($TOKENS_PER_STEP / ($UPDATE_FREQ x $WORLD_SIZE)) = $BATCH_TOKENS" \
          "per batch (at most MAX_TOKENS=$MAX_TOKENS)"
    fi
    per_pass=$(( BATCH_TOKENS * WORLD_SIZE ))
  fi
  log "tokens per step: up to $(( per_pass * UPDATE_FREQ )) source and as many target tokens (paper: ~$PAPER_TOKENS_PER_STEP each)"
  BATCH_ARGS=(--max-tokens "$BATCH_TOKENS" --update-freq "$UPDATE_FREQ"
              --required-batch-size-multiple 1)
}

# checkpoint_args: CHECKPOINT_ARGS, checkpoints every SAVE_INTERVAL_UPDATES updates, the last
# AVERAGE_LAST of them kept for the average step (the newest one when the run is not averaged).
checkpoint_args() {
  local keep=$(( AVERAGE_LAST > 0 ? AVERAGE_LAST : 1 ))
  CHECKPOINT_ARGS=(--save-dir "$CKPT_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES"
                   --keep-interval-updates "$keep" --no-epoch-checkpoints)
}

# log_args: LOG_ARGS, how fairseq-train reports progress: every LOG_INTERVAL updates a line of
# statistics and the plugin's progress line (update n / N, elapsed, time left, loss, lr:
# user_plugin/progress.py); TensorBoard event files in TENSORBOARD_DIR unless it is "none".
log_args() {
  LOG_ARGS=(--log-format simple --log-interval "$LOG_INTERVAL")
  if [ "$TENSORBOARD_DIR" != none ]; then
    LOG_ARGS+=(--tensorboard-logdir "$TENSORBOARD_DIR")
  fi
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
    --optimizer "$OPTIMIZER" --adam-betas "$PAPER_ADAM_BETAS" --adam-eps "$PAPER_ADAM_EPS"
    --lr 1 --lr-scheduler vaswani_inverse_sqrt --warmup-updates "$WARMUP_UPDATES"
    --criterion vaswani_label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING"
    --max-update "$MAX_UPDATE" --seed "$SEED"
    "${BATCH_ARGS[@]}" "${CHECKPOINT_ARGS[@]}" "${LOG_ARGS[@]}" "${RUNTIME_ARGS[@]}"
    "${extra[@]}"
  )
}

# run_training: fairseq-train with TRAIN_ARGS, its output on stdout and appended to TRAIN_LOG.
run_training() {
  log "training $ARCH ($MODEL) on $DEVICE for $MAX_UPDATE updates into $CKPT_DIR"
  log "precision $PRECISION: $PRECISION_WHY"
  if ! run fairseq-train "${TRAIN_ARGS[@]}" 2>&1 | tee -a "$TRAIN_LOG"; then
    die "fairseq-train failed (exit ${PIPESTATUS[0]}); its output: $TRAIN_LOG"
  fi
  if [ "$NODE_RANK" -eq 0 ] && [ ! -f "$CKPT_DIR/checkpoint_last.pt" ]; then
    die "fairseq-train wrote no $CKPT_DIR/checkpoint_last.pt"
  fi
}

# plot_curves: the training curves of TRAIN_LOG (train and validation loss, validation
# perplexity, learning rate, validation BLEU when measured) drawn into CURVES_PNG by
# vaswani-plot-training. A picture that cannot be drawn is a warning, not a failed training.
plot_curves() {
  if vaswani-plot-training "$TRAIN_LOG" --output "$CURVES_PNG"; then
    log "training curves: $CURVES_PNG"
  else
    log "warning: no training curves drawn from $TRAIN_LOG (see the line above)"
  fi
}

# run_identity: CONFIG, the settings a finished or started run is recorded with (its
# fingerprint), and INPUTS, the upstream steps it reads: the data, identified by the binarize
# step's marker, or, for a DATA_BIN made elsewhere (EXTERNAL_DATA=1, no marker), by its content
# (recipes/common.sh, input_id), so that re-binarizing it in place is noticed.
run_identity() {
  CONFIG="v1 $S-$T arch=$ARCH max_update=$MAX_UPDATE warmup=$WARMUP_UPDATES ls=$LABEL_SMOOTHING"
  CONFIG+=" max_tokens=$MAX_TOKENS update_freq=$UPDATE_FREQ device=$DEVICE gpus=$NUM_GPUS"
  CONFIG+=" precision=$PRECISION save=$SAVE_INTERVAL_UPDATES keep=$AVERAGE_LAST seed=$SEED"
  CONFIG+=" task=$TRAIN_TASK extra=$EXTRA_ARGS"
  if [ "$NNODES" -gt 1 ]; then
    CONFIG+=" nodes=$NNODES"
  fi
  if [ "$OPTIMIZER" != adam ]; then
    CONFIG+=" optimizer=$OPTIMIZER"
  fi
  if [ "$BATCH_TOKENS" != "$MAX_TOKENS" ]; then
    CONFIG+=" batch_tokens=$BATCH_TOKENS"
  fi
  INPUTS=("$BIN_DIR")
  EXTERNAL_DATA=0
  if [ -n "${DATA_BIN:-}" ] && [ ! -f "$BIN_DIR/.done" ]; then
    EXTERNAL_DATA=1
  fi
}

# ---- the run --------------------------------------------------------------------------------
train_args
run_identity
[ "$NODE_RANK" = 0 ] || share_step "$CKPT_DIR"  # node 0's recipe holds it
if step_is_current "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}"; then
  log "training $ARCH: already done ($CKPT_DIR/.done, $MAX_UPDATE updates); skipping"
  exit 0
fi
if [ "$EXTERNAL_DATA" = 0 ] && [ -z "${DATA_BIN:-}" ]; then
  require_step "$BIN_DIR" binarize "$PREP_DIR"  # the recipe's own layout: the data is current
elif [ "$EXTERNAL_DATA" = 0 ]; then
  require_step "$BIN_DIR" binarize
else
  require_data_bin "$BIN_DIR" train
  log "training on $BIN_DIR as it is (binarized outside the recipe)"
fi
if [ "$NODE_RANK" -gt 0 ]; then
  # node 0 decides whether to resume or start over, and records the run; fairseq-train here
  # waits at the rendezvous until node 0's has done so
  TRAIN_LOG="$RUN_DIR/train.node$NODE_RANK.log"
  mkdir -p "$RUN_DIR"
  run_training
  log "node $NODE_RANK: training finished (node 0 records the run in $CKPT_DIR)"
  exit 0
fi
# (node 0 only: the other nodes' processes never hold the save directory's lock)
begin_training "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}"

run_training
plot_curves
mapfile -t interval < <(cd "$CKPT_DIR" && ls checkpoint_[0-9]*_[0-9]*.pt 2>/dev/null || true)
if [ "$AVERAGE_LAST" -gt 0 ] && [ "${#interval[@]}" -eq 0 ]; then
  die "no interval checkpoints in $CKPT_DIR (run longer than SAVE_INTERVAL_UPDATES=$SAVE_INTERVAL_UPDATES)"
fi
log "interval checkpoints: ${interval[*]:-none}"
step_mark_done "$CKPT_DIR" "$CONFIG" "${INPUTS[@]}" -- checkpoint_last.pt "${interval[@]}"
