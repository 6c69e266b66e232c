#!/usr/bin/env bash
# Quality parity with fairseq's own Transformer: the Multi30k demo (recipes/demo_multi30k.sh)
# trained twice, once with our vaswani_transformer (--arch vaswani_base) and once with fairseq's
# built-in transformer (--arch transformer), with the same model sizes, data, seed, schedule,
# criterion, optimizer and validation, then averaged, decoded (beam 4, GNMT alpha 0.6, task
# vaswani_translation) and scored the same way. It runs outside CI: about twice the demo.
#
#   bash recipes/parity_multi30k.sh                 # both models, then the comparison
#   bash recipes/parity_multi30k.sh vaswani         # one model only (vaswani | transformer)
#
# Ours is the demo's own run ($WORK_DIR/base): a finished demo is reused, not trained again.
# The built-in model runs in $WORK_DIR/builtin_transformer. When both are finished,
# scripts/parity_report.py writes $PARITY_DIR/parity.md (sacreBLEU and tokenized BLEU side by
# side, with the validation figures) and $PARITY_DIR/parity_curves.png (both runs' training
# curves overlaid). Every part is resumable like the demo; a rerun of finished work changes
# nothing (the comparison is redone when either run was).
#
# Environment (defaults in brackets): WORK_DIR [work_dirs/demo_multi30k], PARITY_DIR
# [$WORK_DIR/parity], and the demo's (SEED [1], MAX_UPDATE, SETUP_VENV, ...), the same for both.
set -euo pipefail
STEP_NAME=parity
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export WORK_DIR
WORK_DIR=$(absolute_path "${WORK_DIR:-$REPO_DIR/work_dirs/demo_multi30k}")
PARITY_DIR=$(absolute_path "${PARITY_DIR:-$WORK_DIR/parity}")
ARMS=("$@")
[ "${#ARMS[@]}" -gt 0 ] || ARMS=(vaswani transformer)

# arm_arch ARM / arm_dir ARM: the architecture and the run directory of one model.
arm_arch() {
  case "$1" in
    vaswani) echo vaswani_base ;;
    transformer) echo transformer ;;
    *) die "unknown model '$1': vaswani (ours) or transformer (fairseq's built-in)" ;;
  esac
}
arm_dir() {
  case "$1" in
    vaswani) echo "$WORK_DIR/base" ;;
    transformer) echo "$WORK_DIR/builtin_transformer" ;;
  esac
}

for arm in "${ARMS[@]}"; do
  arch=$(arm_arch "$arm")
  log "=== $arm: --arch $arch into $(arm_dir "$arm") ==="
  ARCH=$arch RUN_DIR=$(arm_dir "$arm") bash "$RECIPES_DIR/demo_multi30k.sh"
done

for arm in vaswani transformer; do
  if [ ! -f "$(arm_dir "$arm")/score/.done" ]; then
    log "$arm is not finished yet ($(arm_dir "$arm")): no comparison written"
    exit 0
  fi
done
activate_venv
config="v1 vaswani=$(arm_dir vaswani) transformer=$(arm_dir transformer)"
upstream=("$(arm_dir vaswani)/score" "$(arm_dir transformer)/score")
if step_is_done "$PARITY_DIR" "$config" "${upstream[@]}"; then
  log "comparison already written ($PARITY_DIR/.done); skipping"
else
  step_restart "$PARITY_DIR"
  run python "$SCRIPTS_DIR/parity_report.py" \
    --run "vaswani_transformer=$(arm_dir vaswani)" \
    --run "fairseq transformer=$(arm_dir transformer)" \
    --output-dir "$PARITY_DIR"
  step_mark_done "$PARITY_DIR" "$config" "${upstream[@]}" -- \
    parity.md parity.json parity_curves.png
fi
cat "$PARITY_DIR/parity.md"
