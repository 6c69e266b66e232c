#!/usr/bin/env bash
# Table 3 of the paper (§6.2, "Model Variations"): train variations of the base model on a
# language pair's binarized data (the paper: WMT14 EN-DE) and measure each on the dev set,
# newstest2013, without checkpoint averaging: perplexity per word-piece (fairseq-validate),
# BLEU with beam search (fairseq-generate; the generate step's options, recipes/common.sh) and
# the number of parameters; then write a Table-3-like markdown table
# (vaswani-ablation-table).
#
#   VARIANTS="vaswani_table3_base vaswani_table3_c_layers2" bash recipes/ablation.sh wmt14_en_de
#
# Needs binarized data with a joined dictionary (the recipe's data steps, or DATA_BIN made
# elsewhere), whose VALID_SUBSET is newstest2013. Every variant is an architecture name: the
# Table 3 ones are listed by `vaswani-ablation-table list` (vaswani_table3_base,
# ..._c_layers2, ...), and any other registered architecture works too.
#
# Each variant gets a directory $ABLATION_DIR/<variant>/ of steps (their records:
# docs/recipes.md, "Steps"):
#   checkpoints/  the train step, recipes/steps/train.sh with ARCH=<variant>, RUN_DIR=<this
#                 directory>, the row's ε_ls and number of updates and no averaging
#   validate/     validate.log: fairseq-validate on VALID_SUBSET with checkpoints/$CHECKPOINT
#   generate/     generate.log: fairseq-generate on VALID_SUBSET with checkpoints/$CHECKPOINT
#   train.log, validate.log, generate.log   links to the three logs, which the table reads
#   .done         the variant is complete: all three steps finished as they are now
# A finished step is skipped, an interrupted training continues from its last checkpoint (and
# a finished one when MAX_UPDATE grew), a step whose input changed is redone, and so is one
# whose settings changed, except training: it is refused unless START_OVER=1. The table, $ABLATION_DIR/table.md and
# results.json, is a step too (marker $ABLATION_DIR/.done): written again when the requested
# variants or any of their results changed.
#
# Settings (environment variables; defaults in brackets, "paper" ones from user_plugin/paper.py):
#   VARIANTS        architectures to train, space- or comma-separated [all of Table 3]
#   WORK_DIR        [<repo>/work_dirs/<pair>]; DATA_BIN [$WORK_DIR/data-bin]
#   ABLATION_DIR    results, one directory per variant [$WORK_DIR/ablation]
#   MAX_UPDATE      updates per variant [the row's: paper 100000; big 300000]
#   LABEL_SMOOTHING [the row's ε_ls: paper 0.1; 0 and 0.2 in row D]
#   TASK            the fairseq task of training and evaluation [translation: fairseq's
#                   length penalty |Y|^alpha; vaswani_translation: the paper's GNMT penalty]
#   BEAM, LENPEN, MAX_LEN_A, MAX_LEN_B   decoding [paper: 4, 0.6; 1, paper: 50] (as the
#                   generate step: recipes/common.sh, decoding_args)
#   REMOVE_BPE      subwords undone before BLEU [the pair's: subword_nmt | sentencepiece; '' none]
#   VALID_SUBSET    [valid]; CHECKPOINT [checkpoint_last.pt: no averaging, as Table 3]
#   EVAL_MAX_TOKENS [4096]; EVAL_ARGS more fairseq-validate and fairseq-generate options
#   and the train step's (recipes/steps/train.sh): MAX_TOKENS, TOKENS_PER_STEP, UPDATE_FREQ,
#   WARMUP_UPDATES, SAVE_INTERVAL_UPDATES, SEED, DEVICE, NUM_GPUS, PRECISION, EXTRA_ARGS (last
#   on fairseq-train's command line, e.g. tiny sizes), START_OVER.
set -euo pipefail
STEP_NAME=ablation
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
start_pair_run "$@"
detect_device
TASK=${TASK:-translation}
decoding_defaults
ABLATION_DIR=$(absolute_path "${ABLATION_DIR:-$WORK_DIR/ablation}")
TABLE_COMMAND=vaswani-ablation-table
REMOVE_BPE=${REMOVE_BPE-$SUBWORD_POST_PROCESS}
VALID_SUBSET=${VALID_SUBSET:-valid}
CHECKPOINT=${CHECKPOINT:-checkpoint_last.pt}
EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-4096}
EXTRA_ARGS=${EXTRA_ARGS:-}
EVAL_ARGS=${EVAL_ARGS:-}
require_int EVAL_MAX_TOKENS
require_data_bin "$BIN_DIR" "$VALID_SUBSET"

if [ -z "${VARIANTS:-}" ]; then
  VARIANTS=$("$TABLE_COMMAND" list | tr '\n' ' ')
fi
read -r -a variants <<< "${VARIANTS//,/ }"
[ "${#variants[@]}" -gt 0 ] || die "VARIANTS is empty"
# Check every name before training anything: "ARCH LABEL_SMOOTHING TRAIN_STEPS" per variant.
info_errors="$(mktemp)"
if ! info=$("$TABLE_COMMAND" info "${variants[@]}" 2> "$info_errors"); then
  message=$(grep 'error:' "$info_errors" | tail -n 1 | sed "s/^$TABLE_COMMAND: error: //")
  rm -f "$info_errors"
  die "VARIANTS: ${message:-cannot read the architectures ($TABLE_COMMAND info failed)}"
fi
rm -f "$info_errors"
mapfile -t rows <<< "$info"

decoding_args
read -r -a eval_args <<< "$EVAL_ARGS"
bpe_args=()
[ -n "$REMOVE_BPE" ] && bpe_args=(--post-process "$REMOVE_BPE")
eval_config="subset=$VALID_SUBSET checkpoint=$CHECKPOINT task=$TASK"
eval_config+=" max_tokens=$EVAL_MAX_TOKENS args=$EVAL_ARGS"
decoding_config="beam=$BEAM lenpen=$LENPEN max_len=$MAX_LEN_A,$MAX_LEN_B bpe=$REMOVE_BPE"

log "variants: ${variants[*]}"
log "data: $BIN_DIR; results: $ABLATION_DIR; device: $DEVICE"
mkdir -p "$ABLATION_DIR"

# evaluate STEP DIR CONFIG COMMAND...: the step STEP (validate | generate) of the variant in
# DIR, in DIR/STEP: COMMAND on the data's VALID_SUBSET with the variant's checkpoint, its output
# in DIR/STEP/STEP.log. Skipped when done with these settings on the current training run.
evaluate() {
  local step=$1 dir=$2 config=$3 variant
  shift 3
  variant=$(basename "$dir")
  if step_is_done "$dir/$step" "$config" "$dir/checkpoints"; then
    log "$step $variant: already done"
    return 0
  fi
  step_restart "$dir/$step"
  log "$step $variant: $1 on $VALID_SUBSET into $dir/$step/$step.log"
  if ! "$@" --path "$dir/checkpoints/$CHECKPOINT" --max-tokens "$EVAL_MAX_TOKENS" \
      "${eval_args[@]}" > "$dir/$step/$step.log.tmp" 2>&1; then
    tail -n 20 "$dir/$step/$step.log.tmp" >&2
    die "$1 failed for $variant; its output: $dir/$step/$step.log.tmp"
  fi
  mv "$dir/$step/$step.log.tmp" "$dir/$step/$step.log"
  step_mark_done "$dir/$step" "$config" "$dir/checkpoints" -- "$step.log"
}

for row in "${rows[@]}"; do
  read -r arch smoothing row_steps <<< "$row"
  dir="$ABLATION_DIR/$arch"
  log "=== $arch ==="
  ARCH=$arch RUN_DIR=$dir AVERAGE_LAST=0 TRAIN_TASK=$TASK \
    LABEL_SMOOTHING=${LABEL_SMOOTHING:-$smoothing} MAX_UPDATE=${MAX_UPDATE:-$row_steps} \
    EXTRA_ARGS="--valid-subset $VALID_SUBSET $EXTRA_ARGS" \
    bash "$RECIPES_DIR/steps/train.sh" "$PAIR"
  evaluate validate "$dir" "v1 $eval_config" fairseq-validate "$BIN_DIR" "${INFERENCE_ARGS[@]}" \
    --valid-subset "$VALID_SUBSET" --log-format simple
  evaluate generate "$dir" "v1 $eval_config $decoding_config" fairseq-generate "$BIN_DIR" \
    "${DECODING_ARGS[@]}" --gen-subset "$VALID_SUBSET" "${bpe_args[@]}"
  ln -sfn checkpoints/train.log "$dir/train.log"
  ln -sfn validate/validate.log "$dir/validate.log"
  ln -sfn generate/generate.log "$dir/generate.log"
  parts=("$dir/checkpoints" "$dir/validate" "$dir/generate")
  if step_is_done "$dir" "v1 checkpoint=$CHECKPOINT" "${parts[@]}"; then
    log "skipping $arch: already trained and evaluated ($dir/.done)"
  else
    step_mark_done "$dir" "v1 checkpoint=$CHECKPOINT" "${parts[@]}" -- \
      train.log validate.log generate.log "checkpoints/$CHECKPOINT"
  fi
done

# The table of the requested variants, in their order: a step in ABLATION_DIR itself.
variant_dirs=()
for variant in "${variants[@]}"; do variant_dirs+=("$ABLATION_DIR/$variant"); done
table_config="v1 variants=${variants[*]} checkpoint=$CHECKPOINT subset=$VALID_SUBSET"
if step_is_done "$ABLATION_DIR" "$table_config" "${variant_dirs[@]}"; then
  log "table already written from these variants: $ABLATION_DIR/table.md"
else
  run "$TABLE_COMMAND" collect --results-dir "$ABLATION_DIR" --variants "${variants[@]}" \
    --checkpoint "$CHECKPOINT" --subset "$VALID_SUBSET" \
    --output "$ABLATION_DIR/table.md" --json "$ABLATION_DIR/results.json"
  step_mark_done "$ABLATION_DIR" "$table_config" "${variant_dirs[@]}" -- table.md results.json
  log "table: $ABLATION_DIR/table.md"
fi
