#!/usr/bin/env bash
# Table 3 of the paper (§6.2, "Model Variations"): train variations of the base model on WMT14
# EN-DE and measure each on the dev set, newstest2013, without checkpoint averaging:
# perplexity per word-piece (fairseq-validate), BLEU with beam 4 and length penalty 0.6
# (fairseq-generate) and the number of parameters; then write a Table-3-like markdown table
# (scripts/ablation_table.py).
#
# Needs already-binarized data with a joined dictionary (the recipe's data steps), whose
# "valid" subset is newstest2013. Every variant is an architecture name: the Table 3 ones are
# listed by `python scripts/ablation_table.py list` (vaswani_table3_base, ..._c_layers2, ...),
# and any other registered architecture works too.
#
# Settings (environment variables, the paper's values by default):
#   VARIANTS        architectures to train, space- or comma-separated (default: all of Table 3)
#   DATA_BIN        binarized data (default $WORK_DIR/data-bin)
#   WORK_DIR        default <repo>/work_dirs/wmt14_en_de
#   ABLATION_DIR    results, one directory per variant (default $WORK_DIR/ablation)
#   MAX_UPDATE      updates per variant (default: the row's, 100000; big 300000)
#   TOKENS_PER_STEP source (and target) tokens per update (25000, §5.1)
#   MAX_TOKENS      tokens per GPU per forward pass (4096); UPDATE_FREQ (default: enough
#                   accumulation for TOKENS_PER_STEP on NUM_GPUS GPUs)
#   WARMUP_UPDATES  4000 (§5.3); LABEL_SMOOTHING: default the row's ε_ls (0.1; 0 and 0.2 in D)
#   SAVE_INTERVAL_UPDATES  checkpoint every N updates, so an interrupted run resumes (1500)
#   BEAM 4, LENPEN 0.6, MAX_LEN_A 1, MAX_LEN_B 50 (§6.1); REMOVE_BPE subword_nmt ('' for none)
#   VALID_SUBSET    valid; CHECKPOINT checkpoint_last.pt (no averaging, as in Table 3)
#   EVAL_MAX_TOKENS 4096; SEED 1; SHARE_ALL_EMBEDDINGS 1 (§3.4); TASK translation
#   DEVICE gpu|cpu, NUM_GPUS, PRECISION fp16|bf16|fp32 (recipes/common.sh)
#   EXTRA_ARGS      more fairseq-train options, last so they win (e.g. tiny sizes)
#   EVAL_ARGS       more fairseq-validate and fairseq-generate options
#
# Resumable: a finished variant (same settings) is skipped; an interrupted one continues from
# its last checkpoint (and skips the parts it finished: training, validation, generation); one
# whose settings changed is redone from scratch. Delete a variant's directory to redo it. The
# table is rewritten from all requested variants at the end.
set -euo pipefail

STEP_NAME=ablation
# shellcheck source=../common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/common.sh"

activate_venv
detect_device

WORK_DIR=${WORK_DIR:-$REPO_DIR/work_dirs/wmt14_en_de}
DATA_BIN=${DATA_BIN:-$WORK_DIR/data-bin}
ABLATION_DIR=${ABLATION_DIR:-$WORK_DIR/ablation}
TABLE_SCRIPT="$SCRIPTS_DIR/ablation_table.py"
TOKENS_PER_STEP=${TOKENS_PER_STEP:-25000}
MAX_TOKENS=${MAX_TOKENS:-4096}
WARMUP_UPDATES=${WARMUP_UPDATES:-4000}
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-1500}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
MAX_LEN_A=${MAX_LEN_A:-1}
MAX_LEN_B=${MAX_LEN_B:-50}
REMOVE_BPE=${REMOVE_BPE-subword_nmt}
VALID_SUBSET=${VALID_SUBSET:-valid}
CHECKPOINT=${CHECKPOINT:-checkpoint_last.pt}
EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-4096}
SEED=${SEED:-1}
TASK=${TASK:-translation}
SHARE_ALL_EMBEDDINGS=${SHARE_ALL_EMBEDDINGS:-1}
EXTRA_ARGS=${EXTRA_ARGS:-}
EVAL_ARGS=${EVAL_ARGS:-}

for name in TOKENS_PER_STEP MAX_TOKENS WARMUP_UPDATES SAVE_INTERVAL_UPDATES BEAM MAX_LEN_B \
            EVAL_MAX_TOKENS SEED; do
  require_int "$name"
done
[ "$MAX_TOKENS" -ge 1 ] || die "MAX_TOKENS must be at least 1"
[ -d "$DATA_BIN" ] || die "DATA_BIN=$DATA_BIN does not exist (binarize the data first)"
for file in dict.en.txt dict.de.txt "$VALID_SUBSET.en-de.en.bin"; do
  [ -f "$DATA_BIN/$file" ] || die "DATA_BIN=$DATA_BIN has no $file (not binarized EN-DE data?)"
done
if [ -z "${UPDATE_FREQ:-}" ]; then
  gpus=$(( NUM_GPUS > 0 ? NUM_GPUS : 1 ))
  UPDATE_FREQ=$(( (TOKENS_PER_STEP + MAX_TOKENS * gpus - 1) / (MAX_TOKENS * gpus) ))
fi
require_int UPDATE_FREQ

if [ -z "${VARIANTS:-}" ]; then
  VARIANTS=$(python "$TABLE_SCRIPT" list | tr '\n' ' ')
fi
read -r -a variants <<< "${VARIANTS//,/ }"
[ "${#variants[@]}" -gt 0 ] || die "VARIANTS is empty"
# Check every name before training anything: "ARCH LABEL_SMOOTHING TRAIN_STEPS" per variant.
info_errors="$(mktemp)"
if ! info=$(python "$TABLE_SCRIPT" info "${variants[@]}" 2> "$info_errors"); then
  message=$(grep 'error:' "$info_errors" | tail -n 1 | sed 's/^ablation_table.py: error: //')
  rm -f "$info_errors"
  die "VARIANTS: ${message:-cannot read the architectures (python $TABLE_SCRIPT info failed)}"
fi
rm -f "$info_errors"

read -r -a extra_args <<< "$EXTRA_ARGS"
read -r -a eval_args <<< "$EVAL_ARGS"
device_args=()
[ "$DEVICE" = cpu ] && device_args=(--cpu)
share_args=()
[ "$SHARE_ALL_EMBEDDINGS" = 1 ] && share_args=(--share-all-embeddings)
bpe_args=()
[ -n "$REMOVE_BPE" ] && bpe_args=(--remove-bpe "$REMOVE_BPE")

log "variants: ${variants[*]}"
log "data: $DATA_BIN; results: $ABLATION_DIR; device: $DEVICE ($PRECISION)"
mkdir -p "$ABLATION_DIR"

# train_variant ARCH LABEL_SMOOTHING MAX_UPDATE DIR: fairseq-train, resuming from the variant's
# checkpoint_last.pt when there is one; the log of every (re)run is appended to DIR/train.log.
train_variant() {
  local arch=$1 smoothing=$2 max_update=$3 dir=$4
  log "training $arch: $max_update updates, ε_ls $smoothing," \
    "up to $MAX_TOKENS tokens x $UPDATE_FREQ accumulated x $(( NUM_GPUS > 0 ? NUM_GPUS : 1 )) device(s) per step"
  set +e
  fairseq-train "$DATA_BIN" --user-dir "$PLUGIN_DIR" --task "$TASK" \
    --source-lang en --target-lang de --arch "$arch" "${share_args[@]}" \
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9 \
    --lr 1 --lr-scheduler vaswani_inverse_sqrt --warmup-updates "$WARMUP_UPDATES" \
    --criterion vaswani_label_smoothed_cross_entropy --label-smoothing "$smoothing" \
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$max_update" \
    --save-dir "$dir/checkpoints" --save-interval-updates "$SAVE_INTERVAL_UPDATES" \
    --keep-interval-updates 1 --no-epoch-checkpoints --seed "$SEED" \
    --valid-subset "$VALID_SUBSET" --required-batch-size-multiple 1 \
    --log-format simple --log-interval 100 \
    "${device_args[@]}" "${PRECISION_ARGS[@]}" "${extra_args[@]}" \
    >> "$dir/train.log" 2>&1
  local status=$?
  set -e
  if [ "$status" -ne 0 ]; then
    tail -n 20 "$dir/train.log" >&2
    die "fairseq-train failed for $arch (exit $status); full log: $dir/train.log"
  fi
}

# evaluate TOOL DIR OUTPUT ARGS...: run fairseq-TOOL on the variant's checkpoint into
# DIR/OUTPUT, written atomically (a failed run leaves no output behind).
evaluate() {
  local tool=$1 dir=$2 output=$3
  shift 3
  local tmp="$dir/.$output.tmp"
  log "fairseq-$tool on $VALID_SUBSET: $dir/$output"
  if ! "fairseq-$tool" "$DATA_BIN" --user-dir "$PLUGIN_DIR" \
      --task "$TASK" --path "$dir/checkpoints/$CHECKPOINT" --required-batch-size-multiple 1 \
      --max-tokens "$EVAL_MAX_TOKENS" "${device_args[@]}" "$@" "${eval_args[@]}" \
      > "$tmp" 2>&1; then
    tail -n 20 "$tmp" >&2
    die "fairseq-$tool failed for $(basename "$dir"); log: $tmp"
  fi
  mv "$tmp" "$dir/$output"
}

while read -r arch smoothing row_steps; do
  smoothing=${LABEL_SMOOTHING:-$smoothing}
  max_update=${MAX_UPDATE:-$row_steps}
  require_int max_update
  dir="$ABLATION_DIR/$arch"
  settings="arch=$arch ls=$smoothing updates=$max_update tokens=$TOKENS_PER_STEP"
  settings+=" max_tokens=$MAX_TOKENS update_freq=$UPDATE_FREQ warmup=$WARMUP_UPDATES"
  settings+=" seed=$SEED task=$TASK share=$SHARE_ALL_EMBEDDINGS precision=$PRECISION data=$DATA_BIN"
  settings+=" extra=$EXTRA_ARGS eval=$EVAL_ARGS beam=$BEAM lenpen=$LENPEN"
  settings+=" max_len=$MAX_LEN_A,$MAX_LEN_B bpe=$REMOVE_BPE subset=$VALID_SUBSET"
  settings+=" checkpoint=$CHECKPOINT"

  if step_is_done "$dir" "$settings"; then
    log "skipping $arch: finished with these settings ($dir)"
    continue
  fi
  # A directory started with other settings cannot be resumed: start it over.
  if [ -d "$dir" ] && [ "$(cat "$dir/settings" 2>/dev/null || true)" != "$settings" ]; then
    log "starting $arch over: $dir was made with other settings"
    step_restart "$dir"
  fi
  mkdir -p "$dir/checkpoints"
  printf '%s' "$settings" > "$dir/settings"

  # Each part is skipped when its output is there (fairseq-train resumed after its last update
  # would run one update more).
  if [ -f "$dir/train.done" ] && [ -f "$dir/checkpoints/$CHECKPOINT" ]; then
    log "training $arch: already done"
  else
    train_variant "$arch" "$smoothing" "$max_update" "$dir"
    touch "$dir/train.done"
  fi
  if [ -f "$dir/validate.log" ]; then
    log "validation of $arch: already done"
  else
    evaluate validate "$dir" validate.log --valid-subset "$VALID_SUBSET" --log-format simple
  fi
  if [ -f "$dir/generate.log" ]; then
    log "generation of $arch: already done"
  else
    evaluate generate "$dir" generate.log --gen-subset "$VALID_SUBSET" --beam "$BEAM" \
      --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" "${bpe_args[@]}"
  fi
  step_mark_done "$dir" "$settings" -- train.log validate.log generate.log \
    "checkpoints/$CHECKPOINT"
done <<< "$info"

run python "$TABLE_SCRIPT" collect --results-dir "$ABLATION_DIR" --variants "${variants[@]}" \
  --checkpoint "$CHECKPOINT" --subset "$VALID_SUBSET" \
  --output "$ABLATION_DIR/table.md" --json "$ABLATION_DIR/results.json"
log "table: $ABLATION_DIR/table.md"
