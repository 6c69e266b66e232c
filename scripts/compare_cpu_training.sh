#!/usr/bin/env bash
# Training speed on this CPU, the demo's model and data, three ways: stock fairseq's
# `transformer` in float32 (a process without the plugin: stock's --bf16 means a TPU, so fp32
# is stock's best on a CPU), ours in float32, and ours with --bf16 (bf16 weights and
# activations, float32 masters; measured only where the CPU has bf16 instructions). ROUNDS
# rounds of UPDATES updates each, the three alternating, one after the other (nothing else
# should run), validation off. Prints per run the target tokens per second (the mean of
# fairseq's wps over its log intervals) and the last logged loss, then the medians and their
# ratios to the first run named (stock), and each round's ratio to that round's first run (the
# machine's speed drifts between rounds, less within one), with the CPU's model name and flags.
# Stock runs fairseq's adam; ours the optimizer the recipes choose on a CPU
# (user_plugin/training_defaults.py).
#
#   DATA_BIN=work_dirs/demo_multi30k/data-bin bash scripts/compare_cpu_training.sh
#
# Environment: DATA_BIN (required), UPDATES [150], ROUNDS [3], VENV [.venv], RUNS [stock-fp32
# ours-fp32 ours-bf16, the last where the CPU has bf16 instructions]: runs named
# WHO-PRECISION[-compile], WHO stock or ours, PRECISION fp32 or bf16, -compile adding
# --compile-layers (ours only); PROFILE [none]: after the rounds, one more run of each under
# torch.profiler over its last PROFILE updates (user_plugin/measurement/train_step_probe.py,
# run as a file, so a stock run stays stock), printing where its operators' time goes: matrix
# products, attention kernels, the Python between operators and everything else (the
# profiler's cost makes these runs' speeds useless, so they are not counted); JSON_OUT [none]:
# also write the rounds, medians and ratios there as JSON, with the CPU's name and flags.
set -euo pipefail
[ -z "${JSON_OUT:-}" ] || JSON_OUT=$(realpath -m -- "$JSON_OUT")  # from the caller's folder
cd "$(dirname "$0")/.."
: "${DATA_BIN:?set DATA_BIN to the data-bin of the demo (bash recipes/demo_multi30k.sh makes it)}"
UPDATES=${UPDATES:-150} ROUNDS=${ROUNDS:-3}
[[ "$UPDATES" =~ ^[1-9][0-9]*$ && "$UPDATES" -ge 2 ]] \
  || { echo "UPDATES: '$UPDATES' is not a number of updates of at least 2" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: '$ROUNDS' is not a positive number" >&2; exit 2; }
# fairseq logs a speed every LOG_INTERVAL updates: at least two intervals a run
LOG_INTERVAL=$(( UPDATES >= 100 ? 50 : UPDATES / 2 ))
# shellcheck disable=SC1091
source "${VENV:-.venv}/bin/activate"
# the demo's model and schedule (recipes/demo_multi30k.sh); stock's inverse_sqrt peaks at
# equation 3's peak for d_model 256 and 800 warm-up updates
sizes=(--share-all-embeddings --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256
       --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
       --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1
       --adam-betas '(0.9,0.98)' --adam-eps 1e-09 --warmup-updates 800 --label-smoothing 0.1)
read -r _ cpu_optimizer _ <<< "$(python -m user_plugin.training_defaults cpu)"
ours=(--user-dir user_plugin --task vaswani_translation --arch vaswani_base --d-model 256
      --optimizer "$cpu_optimizer" --lr 1 --lr-scheduler vaswani_inverse_sqrt
      --criterion vaswani_label_smoothed_cross_entropy)
stock=(--task translation --arch transformer --optimizer adam --lr 0.0022097
       --lr-scheduler inverse_sqrt --criterion label_smoothed_cross_entropy)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=$(python -c 'from user_plugin.measurement.cpu import cpu_flags, cpu_name
print(cpu_name() + "|" + " ".join(cpu_flags()))')
echo "cpu: ${flags%%|*}, $(nproc) cores; flags: ${flags#*|}; ours: --optimizer $cpu_optimizer"
if [ -n "${RUNS:-}" ]; then
  read -r -a runs <<< "$RUNS"
else
  runs=(stock-fp32 ours-fp32)
  python -c 'from user_plugin.measurement.cpu import has_bf16_instructions as h
raise SystemExit(0 if h() else 1)' && runs+=(ours-bf16)
fi
for run in "${runs[@]}"; do
  [[ "$run" =~ ^(stock-fp32|ours-(fp32|bf16)(-compile)?)$ ]] \
    || { echo "RUNS: '$run' is not stock-fp32 or ours-PRECISION[-compile] (PRECISION fp32 or bf16; stock's --bf16 means a TPU)" >&2; exit 2; }
done
if [ -n "${JSON_OUT:-}" ]; then
  [ -d "$(dirname -- "$JSON_OUT")" ] && [ ! -d "$JSON_OUT" ] \
    || { echo "JSON_OUT: '$JSON_OUT' is not a file path in an existing folder" >&2; exit 2; }
  # the package's rule for every output (no device node, nothing inside DATA_BIN), before training
  python -c 'import sys
from user_plugin.files.atomic import refuse_input_clash
from user_plugin.files.errors import UserError
try:
    refuse_input_clash(sys.argv[1], [sys.argv[2]])
except UserError as error:
    raise SystemExit(f"JSON_OUT: {error}")' "$JSON_OUT" "$DATA_BIN" || exit 2
fi
if [ -n "${PROFILE:-}" ]; then
  [[ "$PROFILE" =~ ^[1-9][0-9]*$ ]] && (( PROFILE < UPDATES )) \
    || { echo "PROFILE: '$PROFILE' is not a number of updates from 1 to UPDATES - 1 ($((UPDATES - 1)))" >&2; exit 2; }
fi
# the arguments of fairseq-train for RUN, into args
train_args() {
  if [ "${1%%-*}" = ours ]; then args=("${ours[@]}"); else args=("${stock[@]}"); fi
  [[ "$1" == *-bf16* ]] && args+=(--bf16)
  [[ "$1" == *-compile ]] && args+=(--compile-layers)
  args=("$DATA_BIN" "${sizes[@]}" "${args[@]}" --max-update "$UPDATES" --seed 1
        --max-tokens 2048 --required-batch-size-multiple 1 --save-dir "$work/$1" --no-save
        --disable-validation --log-format simple --log-interval "$LOG_INTERVAL" --num-workers 1 --cpu)
}
declare -A rates losses
for round in $(seq "$ROUNDS"); do
  for run in "${runs[@]}"; do
    train_args "$run"
    fairseq-train "${args[@]}" > "$work/log" 2>&1 || { tail -5 "$work/log"; exit 1; }
    rate=$(grep -o 'wps=[0-9.]*' "$work/log" | cut -d= -f2 \
           | python -c 'import statistics, sys; print(round(statistics.mean(map(float, sys.stdin))))')
    loss=$(grep -o ' loss=[0-9.]*' "$work/log" | tail -1)
    echo "round $round $run: $rate target tokens/s,$loss"
    rates[$run]+="$rate "
    losses[$run]+="${loss#*=} "
  done
done
for run in "${runs[@]}"; do echo "$run|${rates[$run]}|${losses[$run]}"; done \
  | CPU_NAME="${flags%%|*}" CPU_FLAGS="${flags#*|}" OPTIMIZER="$cpu_optimizer" UPDATES="$UPDATES" \
    python -c '
import json, os, statistics, sys
rates, losses = {}, {}
for line in sys.stdin:
    name, values, last_losses = line.strip().split("|")
    rates[name] = [float(v) for v in values.split()]
    losses[name] = [float(v) for v in last_losses.split()]
first = next(iter(rates))
medians = {name: statistics.median(values) for name, values in rates.items()}
print("median target tokens/s: " + ", ".join(
    f"{name} {value:,.0f} ({value / medians[first]:.2f}x {first})"
    for name, value in medians.items()))
# each round against the first run of the same round: the machine drifts between rounds
by_round = {}
for name, values in list(rates.items())[1:]:
    by_round[name] = [mine / theirs for mine, theirs in zip(values, rates[first])]
    print(f"{name} / {first}, round by round: " + " ".join(f"{r:.2f}" for r in by_round[name])
          + f"; median {statistics.median(by_round[name]):.2f}x")
out = os.environ.get("JSON_OUT")
if out:
    report = {
        "machine": {"cpu": os.environ["CPU_NAME"], "cores": os.cpu_count(),
                    "flags": os.environ["CPU_FLAGS"].split()},
        "settings": {"updates": int(os.environ["UPDATES"]), "rounds": len(rates[first]),
                     "optimizer_ours": os.environ["OPTIMIZER"], "baseline": first},
        "target_tokens_per_s": rates, "last_logged_loss": losses,
        "median_target_tokens_per_s": medians,
        "median_vs_baseline": {name: value / medians[first] for name, value in medians.items()},
        "round_by_round_vs_baseline": by_round,
        "median_of_round_ratios": {n: statistics.median(r) for n, r in by_round.items()},
    }
    from user_plugin.files.atomic import atomic_write_text
    atomic_write_text(out, json.dumps(report, indent=1) + "\n", [os.environ["DATA_BIN"]])
    print(f"wrote {out}")'
[ -n "${PROFILE:-}" ] || exit 0
for run in "${runs[@]}"; do
  train_args "$run"
  python user_plugin/measurement/train_step_probe.py "$work/$run.json" \
    --profile "$((UPDATES - PROFILE + 1)):$PROFILE" -- fairseq_cli.train "${args[@]}" \
    > "$work/log" 2>&1 || { tail -5 "$work/log"; exit 1; }
  python -c 'import json, sys
from user_plugin.measurement.train_step_probe import shares_line
profile = json.load(open(sys.argv[1]))["profile"]
first, last = profile["calls"]
print(f"{sys.argv[2]}, profiled updates {first}-{last}: "
      + shares_line(profile["host_operator_shares"]))' "$work/$run.json" "$run"
done
