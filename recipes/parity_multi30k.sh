#!/usr/bin/env bash
# Quality parity with fairseq's own Transformer on the Multi30k demo (recipes/demo_multi30k.sh):
# our vaswani_transformer (--arch vaswani_base, the demo's own run) beside fairseq's built-in
# transformer (--arch transformer) trained and decoded by STOCK fairseq, in processes without
# the plugin (no --user-dir: none of its fairseq patches, its task, criterion or scheduler), as
# a fairseq user would run it. It runs outside CI: about twice the demo.
#
#   bash recipes/parity_multi30k.sh                 # both models, then the comparison
#   bash recipes/parity_multi30k.sh vaswani         # one model only (vaswani | transformer)
#
# Both models have the same sizes, data, seed, batches, schedule and checkpoint averaging. The
# built-in uses fairseq's equivalents of ours: task translation, criterion
# label_smoothed_cross_entropy (the same loss), scheduler inverse_sqrt with --lr d^-0.5 w^-0.5
# --warmup-init-lr 0 (the paper's formula), and decodes with beam 4 and fairseq's --lenpen 0.6,
# which divides by |Y|^0.6 instead of the paper's GNMT penalty, within 1 x the longest source of
# the batch + 50. Stock fairseq-generate cannot read stock fairseq's checkpoints under torch's
# safe loading (an argparse.Namespace in them): it runs with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1.
# Averaging, detokenization and scoring are the project's file tools, the same for both.
#
# Ours is the demo's own run ($WORK_DIR/base), which also prepares the data; the built-in runs
# in $WORK_DIR/builtin_transformer on that data. When both are finished,
# scripts/parity_report.py writes $PARITY_DIR/parity.md (sacreBLEU and tokenized BLEU side by
# side, with the validation figures, and whether each process had the plugin, read from the
# configuration fairseq logged) and $PARITY_DIR/parity_curves.png. Every part is resumable; a
# rerun of finished work changes nothing (the comparison is redone when either run was).
#
# Environment (defaults in brackets): WORK_DIR [work_dirs/demo_multi30k], PARITY_DIR
# [$WORK_DIR/parity], and the demo's (SEED [1], MAX_UPDATE [1800], MAX_TOKENS [2048],
# WARMUP_UPDATES [800], SAVE_INTERVAL_UPDATES [100], LOG_INTERVAL [50], DEMO_MODEL_ARGS,
# AVERAGE_LAST, EVAL_BLEU [1 here: validation BLEU for both], SETUP_VENV, ...), the same for both.
set -euo pipefail
STEP_NAME=parity
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export WORK_DIR
WORK_DIR=$(absolute_path "${WORK_DIR:-$REPO_DIR/work_dirs/demo_multi30k}")
PARITY_DIR=$(absolute_path "${PARITY_DIR:-$WORK_DIR/parity}")
ARMS=("$@")
# Validation BLEU at the averaged checkpoints of both models (the report compares them; the
# demo alone leaves it off): passed on to the demo, which trains ours.
export EVAL_BLEU=${EVAL_BLEU:-1}
[ "${#ARMS[@]}" -gt 0 ] || ARMS=(vaswani transformer)

# arm_dir ARM: the run directory of one model.
arm_dir() {
  case "$1" in
    vaswani) echo "$WORK_DIR/base" ;;
    transformer) echo "$WORK_DIR/builtin_transformer" ;;
    *) die "unknown model '$1': vaswani (ours) or transformer (fairseq's built-in)" ;;
  esac
}

# stock_fairseq COMMAND ARGS...: a fairseq command in a process without the plugin (no
# --user-dir, nothing of the project on PYTHONPATH).
stock_fairseq() {
  local arg
  for arg in "$@"; do
    [ "$arg" != --user-dir ] || die "internal: stock fairseq is run without --user-dir"
  done
  run env -u PYTHONPATH "$@"
}

# builtin_settings: the demo's settings (the same defaults as recipes/demo_multi30k.sh) and the
# paths of the built-in's run, on the demo's prepared data.
builtin_settings() {
  load_pair wmt14_en_de
  activate_venv
  MODEL=base
  RUN_DIR=$(arm_dir transformer)
  unset DATA_BIN
  setup_paths
  MAX_UPDATE=${MAX_UPDATE:-1800}
  MAX_TOKENS=${MAX_TOKENS:-2048}
  WARMUP_UPDATES=${WARMUP_UPDATES:-800}
  SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-100}
  LOG_INTERVAL=${LOG_INTERVAL:-50}
  SEED=${SEED:-1}
  AVERAGE_LAST=${AVERAGE_LAST:-$PAPER_BASE_AVERAGE_LAST}
  DEMO_MODEL_ARGS=${DEMO_MODEL_ARGS:-"--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1"}
  for name in MAX_UPDATE MAX_TOKENS WARMUP_UPDATES SAVE_INTERVAL_UPDATES LOG_INTERVAL SEED \
      AVERAGE_LAST; do
    require_int "$name"
  done
  [[ " $DEMO_MODEL_ARGS " =~ \ --decoder-embed-dim\ ([0-9]+)\  ]] \
    || die "DEMO_MODEL_ARGS must give --decoder-embed-dim (d_model of the schedule)"
  D_MODEL=${BASH_REMATCH[1]}
  # validation (and so the interval checkpoints) at the averaged checkpoints only, as the demo
  VALIDATE_FROM=$(( MAX_UPDATE - (AVERAGE_LAST - 1) * SAVE_INTERVAL_UPDATES ))
  # Equation 3 at its peak (step = warmup): d_model^-0.5 * warmup^-0.5
  PEAK_LR=$(python -c "print($D_MODEL ** -0.5 * $WARMUP_UPDATES ** -0.5)")
  decoding_defaults
}

# builtin_train: stock fairseq-train of --arch transformer (resumable; skipped when finished).
builtin_train() {
  local -a model validation=() extra=(--cpu)
  read -r -a model <<< "$DEMO_MODEL_ARGS"
  validation=(--validate-interval 1000 --validate-after-updates "$VALIDATE_FROM")
  case "$EVAL_BLEU" in
    1) validation+=(--eval-bleu --eval-bleu-args "{\"beam\":$PAPER_BEAM,\"lenpen\":$PAPER_LENPEN}"
                    --eval-bleu-remove-bpe --eval-bleu-detok moses
                    --eval-bleu-detok-args '{"target_lang":"de"}'
                    --best-checkpoint-metric bleu --maximize-best-checkpoint-metric) ;;
    0) ;;
    *) die "EVAL_BLEU must be 1 or 0, got '$EVAL_BLEU'" ;;
  esac
  local config="v1 builtin arch=transformer max_update=$MAX_UPDATE warmup=$WARMUP_UPDATES"
  config+=" lr=$PEAK_LR max_tokens=$MAX_TOKENS seed=$SEED save=$SAVE_INTERVAL_UPDATES"
  config+=" keep=$AVERAGE_LAST eval_bleu=$EVAL_BLEU validate_from=$VALIDATE_FROM"
  config+=" model=$DEMO_MODEL_ARGS"
  if step_is_current "$CKPT_DIR" "$config" "$BIN_DIR"; then
    log "built-in transformer: already trained ($CKPT_DIR/.done); skipping"
    return 0
  fi
  require_step "$BIN_DIR" binarize
  begin_training "$CKPT_DIR" "$config" "$BIN_DIR"
  log "training fairseq's transformer with stock fairseq (no plugin) into $CKPT_DIR"
  if ! stock_fairseq fairseq-train "$BIN_DIR" --task translation \
      --source-lang "$SRC_LANG" --target-lang "$TGT_LANG" \
      --arch transformer --share-all-embeddings "${model[@]}" \
      --optimizer adam --adam-betas "$PAPER_ADAM_BETAS" --adam-eps "$PAPER_ADAM_EPS" \
      --lr "$PEAK_LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP_UPDATES" \
      --warmup-init-lr 0 \
      --criterion label_smoothed_cross_entropy --label-smoothing "$PAPER_LABEL_SMOOTHING" \
      --max-update "$MAX_UPDATE" --seed "$SEED" --max-tokens "$MAX_TOKENS" \
      --required-batch-size-multiple 1 \
      --save-dir "$CKPT_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES" \
      --keep-interval-updates "$AVERAGE_LAST" --no-epoch-checkpoints \
      "${validation[@]}" \
      --log-format simple --log-interval "$LOG_INTERVAL" "${extra[@]}" \
      2>&1 | tee -a "$CKPT_DIR/train.log"; then
    die "fairseq-train failed (exit ${PIPESTATUS[0]}); its output: $CKPT_DIR/train.log"
  fi
  local -a interval
  mapfile -t interval < <(cd "$CKPT_DIR" && ls checkpoint_[0-9]*_[0-9]*.pt 2>/dev/null || true)
  [ "${#interval[@]}" -gt 0 ] || die "no interval checkpoints in $CKPT_DIR"
  step_mark_done "$CKPT_DIR" "$config" "$BIN_DIR" -- checkpoint_last.pt "${interval[@]}"
}

# builtin_generate: stock fairseq-generate of the averaged checkpoint on the test set.
builtin_generate() {
  local config="v1 builtin beam=$BEAM lenpen=$LENPEN max_len=$MAX_LEN_A,$MAX_LEN_B" expected
  if step_is_done "$GEN_DIR" "$config" "$BIN_DIR" "$PREP_DIR" "$AVG_DIR"; then
    log "built-in transformer: already decoded ($GEN_DIR/.done); skipping"
    return 0
  fi
  require_step "$AVG_DIR" average
  expected=$("$PREPARE_TEXT" check-lines "$PREP_DIR/test.$SRC_LANG" \
    "$PREP_DIR/test.ref.$TGT_LANG") || die "prepared test set and reference differ in length"
  step_restart "$GEN_DIR"
  log "translating $expected test sentences with stock fairseq-generate (no plugin; fairseq's" \
      "length penalty |Y|^$LENPEN)"
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 stock_fairseq fairseq-generate "$BIN_DIR" \
    --task translation --source-lang "$SRC_LANG" --target-lang "$TGT_LANG" \
    --gen-subset test --path "$AVG_DIR/checkpoint_avg.pt" \
    --beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
    --required-batch-size-multiple 1 --max-tokens 8000 --post-process "$SUBWORD_POST_PROCESS" \
    --cpu > "$GEN_DIR/generate-test.txt.tmp" 2> "$GEN_DIR/generate.log" \
    || die "fairseq-generate failed; its log: $GEN_DIR/generate.log"
  mv "$GEN_DIR/generate-test.txt.tmp" "$GEN_DIR/generate-test.txt"
  "$PREPARE_TEXT" extract-hypotheses --expected "$expected" \
    "$GEN_DIR/generate-test.txt" "$GEN_DIR/hyp.$TGT_LANG"
  "$PREPARE_TEXT" detokenize --lang "$TGT_LANG" "$GEN_DIR/hyp.$TGT_LANG" \
    "$GEN_DIR/hyp.detok.$TGT_LANG"
  step_mark_done "$GEN_DIR" "$config" "$BIN_DIR" "$PREP_DIR" "$AVG_DIR" -- \
    generate-test.txt generate.log "hyp.$TGT_LANG" "hyp.detok.$TGT_LANG"
}

# run_builtin: the built-in arm, step by step (averaging and scoring by the recipes' own steps).
run_builtin() {
  builtin_settings
  builtin_train
  export WORK_DIR RUN_DIR MODEL AVERAGE_LAST
  bash "$RECIPES_DIR/steps/average.sh" wmt14_en_de
  builtin_generate
  bash "$RECIPES_DIR/steps/score.sh" wmt14_en_de
}

for arm in "${ARMS[@]}"; do
  case "$arm" in
    vaswani)
      log "=== vaswani: --arch vaswani_base into $(arm_dir vaswani) (recipes/demo_multi30k.sh) ==="
      ARCH=vaswani_base RUN_DIR=$(arm_dir vaswani) bash "$RECIPES_DIR/demo_multi30k.sh"
      ;;
    transformer)
      log "=== transformer: stock fairseq, --arch transformer into $(arm_dir transformer) ==="
      ( run_builtin )
      ;;
    *) arm_dir "$arm" > /dev/null ;;
  esac
done

for arm in vaswani transformer; do
  if [ ! -f "$(arm_dir "$arm")/score/.done" ]; then
    log "$arm is not finished yet ($(arm_dir "$arm")): no comparison written"
    exit 0
  fi
done
activate_venv
config="v2 vaswani=$(arm_dir vaswani) transformer=$(arm_dir transformer)"
upstream=("$(arm_dir vaswani)/score" "$(arm_dir transformer)/score")
if step_is_done "$PARITY_DIR" "$config" "${upstream[@]}"; then
  log "comparison already written ($PARITY_DIR/.done); skipping"
else
  step_restart "$PARITY_DIR"
  run python "$SCRIPTS_DIR/parity_report.py" \
    --run "vaswani_transformer=$(arm_dir vaswani)" \
    --run "fairseq transformer (stock fairseq)=$(arm_dir transformer)" \
    --output-dir "$PARITY_DIR"
  step_mark_done "$PARITY_DIR" "$config" "${upstream[@]}" -- \
    parity.md parity.json parity_curves.png
fi
cat "$PARITY_DIR/parity.md"
