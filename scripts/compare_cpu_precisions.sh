#!/usr/bin/env bash
# fp32 against --bf16 (bf16 weights and activations, float32 master weights) for the demo's
# model on this CPU: ROUNDS alternating runs of UPDATES updates each on DATA_BIN (the demo's
# binarized Multi30k), validation off, one after the other (nothing else should run). Prints,
# per run, the seconds per update fairseq's progress line reports over the run and the last
# logged loss, then the ratio of the medians, with the CPU's model name and bf16 flags.
#
#   DATA_BIN=work_dirs/demo_multi30k/data-bin bash scripts/compare_cpu_precisions.sh
#
# Environment: DATA_BIN (required), UPDATES [150], ROUNDS [3], VENV [.venv].
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATA_BIN:?set DATA_BIN to the data-bin of the demo (bash recipes/demo_multi30k.sh makes it)}"
UPDATES=${UPDATES:-150} ROUNDS=${ROUNDS:-3}
# shellcheck disable=SC1091
source "${VENV:-.venv}/bin/activate"
# the demo's model and schedule (recipes/demo_multi30k.sh)
model=(--arch vaswani_base --share-all-embeddings --encoder-layers 3 --decoder-layers 3
       --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024
       --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4
       --dropout 0.1 --d-model 256)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)
bf16_flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -oE '\b(amx_bf16|avx512_bf16)\b' | sort -u)
echo "cpu:${cpu}, $(nproc) cores; bf16 flags: ${bf16_flags//$'\n'/ }"
declare -A rates
for round in $(seq "$ROUNDS"); do
  for precision in fp32 bf16; do
    flags=(); [ "$precision" = fp32 ] || flags=(--bf16)
    fairseq-train "$DATA_BIN" --user-dir user_plugin --task vaswani_translation "${model[@]}" \
      --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-09 --lr 1 \
      --lr-scheduler vaswani_inverse_sqrt --warmup-updates 800 \
      --criterion vaswani_label_smoothed_cross_entropy --label-smoothing 0.1 \
      --max-update "$UPDATES" --seed 1 --max-tokens 2048 --required-batch-size-multiple 1 \
      --save-dir "$work/$precision" --no-save --disable-validation --log-format simple \
      --log-interval 50 --num-workers 1 --cpu "${flags[@]}" > "$work/log" 2>&1 \
      || { tail -5 "$work/log"; exit 1; }
    rate=$(grep -o '([0-9.]* s/update)' "$work/log" | tail -1 | tr -d '()' | cut -d' ' -f1)
    loss=$(grep -o 'loss [0-9.]*' "$work/log" | tail -1)
    echo "round $round $precision: $rate s/update, $loss"
    rates[$precision]+="$rate "
  done
done
python - "${rates[fp32]}" "${rates[bf16]}" <<'PY'
import statistics, sys
fp32, bf16 = (statistics.median(map(float, arg.split())) for arg in sys.argv[1:])
print(f"median s/update: fp32 {fp32:.3f}, bf16 {bf16:.3f}: bf16 is {fp32 / bf16:.2f}x fp32's speed")
PY
