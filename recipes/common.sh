# shellcheck shell=bash
# The recipes' shared functions (sourced): logging, settings, language pairs, paths, devices,
# decoding, and the steps, whose records vaswani-step keeps (docs/recipes.md, "Steps").

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$RECIPES_DIR/.." && pwd)
PLUGIN_DIR="$REPO_DIR/user_plugin"
SCRIPTS_DIR="$REPO_DIR/scripts" PREPARE_TEXT=vaswani-prepare-text
PAIRS_DIR="$RECIPES_DIR/pairs" STEP_NAME=${STEP_NAME:-recipe}
export RECIPE_CALLER=${RECIPE_CALLER:-"$(basename "$0") (pid $$, started $(date '+%F %T'))"}
HELD_STEPS=$'\n'

# log: a timestamped progress line on stderr; die: one error line, exit 1; run: log, then run.
log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "$STEP_NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$STEP_NAME" "$*" >&2; exit 1; }
run() { log "+ $*"; "$@"; }
num_cpus() { nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1; }

# activate_venv: $VENV [<repo>/.venv] unless one is active; then the paper's settings, PAPER_BEAM
# and the like, defined once in user_plugin/paper.py (which prints them when run as a script).
activate_venv() {
  local venv=${VENV:-$REPO_DIR/.venv} assignments
  if [ -z "${VIRTUAL_ENV:-}" ] && [ -f "$venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    set +u; source "$venv/bin/activate"; set -u
  fi
  command -v fairseq-train >/dev/null 2>&1 \
    || die "fairseq-train not found: run scripts/setup_venv.sh (or set VENV to a virtualenv)"
  command -v vaswani-step >/dev/null 2>&1 \
    || die "the vaswani commands are not installed: run scripts/setup_venv.sh (or pip install .)"
  export PYTHONUNBUFFERED=1
  assignments=$(python "$PLUGIN_DIR/paper.py") \
    || die "cannot read the paper's settings (python $PLUGIN_DIR/paper.py failed)"
  eval "$assignments"
}

# require_int NAME / require_flag NAME: die unless variable NAME is an integer >= 0 / 0, 1, unset.
require_int() { [[ "${!1-}" =~ ^[0-9]+$ ]] || die "$1 must be an integer >= 0, got '${!1-}'"; }
require_flag() { [[ "${!1:-0}" =~ ^[01]$ ]] || die "$1 must be 0 or 1, got '${!1}'"; }

# require_usable_path NAME: die when the path in variable NAME holds a line break (records hold
# a path a line) or ':' (where fairseq splits its data and checkpoint paths).
require_usable_path() {
  case "${!1-}" in
    *$'\n'*) die "$1 must not contain a line break, got '${!1//$'\n'/\\n}'" ;;
    *:*) die "$1 must not contain ':' (fairseq splits its data and checkpoint paths there)," \
      "got '${!1}'" ;;
  esac
}

# absolute_path PATH: PATH from the current directory, normalised without resolving links.
absolute_path() { local p=$1; [[ "$p" == /* ]] || p=$PWD/$p; realpath -m -s -- "$p"; }

# ---- language pairs: recipes/pairs/<pair>.sh sets SRC_LANG, TGT_LANG, SUBWORD (bpe or
# sentencepiece), BIG_ARCH and what the prepare step downloads (TRAIN_CORPORA, DEV_SET, TEST_SET)
known_pairs() { local n=("$PAIRS_DIR"/*.sh); n=("${n[@]##*/}"); echo "${n[*]%.sh}"; }

# load_pair [PAIR]: the pair PAIR (argument, else variable); unknown: one line naming the known.
load_pair() {
  [ $# -le 1 ] || die "usage: bash $0 PAIR, with PAIR one of: $(known_pairs) (got: $*)"
  PAIR=${1:-${PAIR:-}}
  [ -n "$PAIR" ] || die "usage: bash $0 PAIR, with PAIR one of: $(known_pairs)"
  if [[ ! "$PAIR" =~ ^[A-Za-z0-9_-]+$ ]] || [ ! -f "$PAIRS_DIR/$PAIR.sh" ]; then
    die "unknown language pair '$PAIR'; the known ones: $(known_pairs) (recipes/pairs/<pair>.sh)"
  fi
  # shellcheck disable=SC1090
  source "$PAIRS_DIR/$PAIR.sh"
  PAIR_NAME=$PAIR
}

# start_pair_run [PAIR]: the start of a script that works on a language pair.
start_pair_run() { load_pair "$@"; activate_venv; setup_paths; }

# setup_paths: the steps' directories (absolute; none created): PREP_DIR, BIN_DIR (= DATA_BIN),
# CKPT_DIR, AVG_DIR, GEN_DIR, SCORE_DIR, PKG_DIR (docs/recipes.md). A step empties its directory when
# redone, so none may be or hold another's, RAW_DIR, WORK_DIR, the repository or HOME.
setup_paths() {
  local name kept
  for name in WORK_DIR DATA_BIN RUN_DIR; do require_usable_path "$name"; done
  WORK_DIR=$(absolute_path "${WORK_DIR:-$REPO_DIR/work_dirs/$PAIR_NAME}")
  MODEL=${MODEL:-base}
  [[ "$MODEL" =~ ^(base|big)$ ]] || die "MODEL must be base or big, got '$MODEL'"
  PREP_DIR="$WORK_DIR/prepared"
  BIN_DIR=$(absolute_path "${DATA_BIN:-$WORK_DIR/data-bin}")
  RUN_DIR=$(absolute_path "${RUN_DIR:-$WORK_DIR/$MODEL}")
  CKPT_DIR="$RUN_DIR/checkpoints" AVG_DIR="$RUN_DIR/average"
  GEN_DIR="$RUN_DIR/generate" SCORE_DIR="$RUN_DIR/score" PKG_DIR="$RUN_DIR/model"
  kept=("WORK_DIR=$WORK_DIR" "the repository=$REPO_DIR")
  [ -z "${RAW_DIR:-}" ] || kept+=("RAW_DIR=$(absolute_path "$RAW_DIR")")
  [ -z "${HOME:-}" ] || kept+=("HOME=$(absolute_path "$HOME")")
  ask apart "prepare=$PREP_DIR" "binarize=$BIN_DIR" "train=$CKPT_DIR" "average=$AVG_DIR" \
    "generate=$GEN_DIR" "score=$SCORE_DIR" "package=$PKG_DIR" -- "${kept[@]}" \
    || die "$ANSWER: choose DATA_BIN, RUN_DIR, WORK_DIR and RAW_DIR apart"
}

# require_data_bin DIR [SUBSET...]: die unless DIR holds fairseq-preprocess output of the pair:
# both dictionaries and the binary files of each SUBSET.
require_data_bin() {
  local subset lang file pair="$SRC_LANG-$TGT_LANG" files=(dict.{"$SRC_LANG","$TGT_LANG"}.txt)
  [ -d "$1" ] || die "$1 does not exist (binarize the data first)"
  for subset in "${@:2}"; do
    for lang in "$SRC_LANG" "$TGT_LANG"; do files+=("$subset.$pair.$lang."{bin,idx}); done
  done
  for file in "${files[@]}"; do
    [ -f "$1/$file" ] || die "$1 has no $file (not binarized $pair data?)"
  done
}

# model_defaults: unless given, the paper's ARCH, MAX_UPDATE, AVERAGE_LAST and
# SAVE_INTERVAL_UPDATES (every 10 minutes) for MODEL (Table 3, §5.2, §6.1).
model_defaults() {
  local size=BIG arch=${BIG_ARCH-}
  [ "$MODEL" != base ] || size=BASE arch=vaswani_base
  local steps="PAPER_${size}_TRAIN_STEPS" last="PAPER_${size}_AVERAGE_LAST"
  local every="PAPER_${size}_SAVE_INTERVAL"
  ARCH=${ARCH:-$arch} MAX_UPDATE=${MAX_UPDATE:-${!steps}} AVERAGE_LAST=${AVERAGE_LAST:-${!last}}
  SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-${!every}}
  require_int MAX_UPDATE; require_int AVERAGE_LAST; require_int SAVE_INTERVAL_UPDATES
}

# detect_device: DEVICE [gpu when torch sees one, else cpu], NUM_GPUS, VISIBLE_GPUS, PRECISION,
# DEVICE_OPTIMIZER [user_plugin/training_defaults.py's for the device, and why], PRECISION_ARGS.
detect_device() {
  local capability defaults precision
  read -r VISIBLE_GPUS capability <<< "$(cd "$REPO_DIR" \
    && python -m user_plugin.training_defaults gpus 2>/dev/null || echo "0 0")"
  DEVICE=${DEVICE:-$([ "$VISIBLE_GPUS" -gt 0 ] && echo gpu || echo cpu)}
  case "$DEVICE" in
    gpu)
      [ "$VISIBLE_GPUS" -gt 0 ] || die "DEVICE=gpu but torch sees no GPU"
      NUM_GPUS=${NUM_GPUS:-$VISIBLE_GPUS}
      require_int NUM_GPUS
      [ "$NUM_GPUS" -ge 1 ] && [ "$NUM_GPUS" -le "$VISIBLE_GPUS" ] \
        || die "NUM_GPUS=$NUM_GPUS but torch sees $VISIBLE_GPUS GPU(s)" ;;
    cpu) NUM_GPUS=0 ;;
    *) die "DEVICE must be gpu or cpu, got '$DEVICE'" ;;
  esac
  defaults=$(cd "$REPO_DIR" && python -m user_plugin.training_defaults "$DEVICE" "$capability")
  read -r precision DEVICE_OPTIMIZER PRECISION_WHY <<< "$defaults" || exit 1
  [ -z "${PRECISION:-}" ] || PRECISION_WHY="PRECISION=$PRECISION"
  PRECISION=${PRECISION:-$precision}
  case "$PRECISION" in
    fp32) PRECISION_ARGS=() ;;
    fp16|bf16) PRECISION_ARGS=("--$PRECISION") ;;
    *) die "PRECISION must be fp16, bf16 or fp32, got '$PRECISION'" ;;
  esac
}

# ---- decoding (§6.1): BEAM, LENPEN, MAX_LEN_A [1], MAX_LEN_B (output bound MAX_LEN_A x source
# + MAX_LEN_B) with the paper's defaults; SUBWORD_POST_PROCESS, fairseq's undoing of subwords.
decoding_defaults() {
  BEAM=${BEAM:-$PAPER_BEAM} LENPEN=${LENPEN:-$PAPER_LENPEN}
  MAX_LEN_A=${MAX_LEN_A:-1} MAX_LEN_B=${MAX_LEN_B:-$PAPER_MAX_LEN_OVER_SOURCE}
  require_int BEAM; require_int MAX_LEN_B
  case "$SUBWORD" in
    bpe) SUBWORD_POST_PROCESS=subword_nmt ;;
    sentencepiece) SUBWORD_POST_PROCESS=sentencepiece ;;
    *) die "the pair's SUBWORD must be bpe or sentencepiece, got '$SUBWORD'" ;;
  esac
}

# INFERENCE_ARGS: fairseq-validate's and -generate's options; DECODING_ARGS: the beam search of
# TASK (vaswani_translation: the GNMT penalty, each sentence's source + MAX_LEN_B; fairseq's
# tasks: |Y|^alpha, a batch's longest source x MAX_LEN_A + MAX_LEN_B).
inference_args() {
  INFERENCE_ARGS=(--user-dir "$PLUGIN_DIR" --task "$TASK" --required-batch-size-multiple 1)
  [ "$DEVICE" != cpu ] || INFERENCE_ARGS+=(--cpu)
}
decoding_args() {
  inference_args
  DECODING_ARGS=("${INFERENCE_ARGS[@]}" --beam "$BEAM" --lenpen "$LENPEN")
  if [ "$TASK" = vaswani_translation ]; then
    DECODING_ARGS+=(--max-len-over-source "$MAX_LEN_B")
  else
    log "note: TASK=$TASK uses fairseq's length penalty |Y|^alpha, not the paper's GNMT penalty"
    DECODING_ARGS+=(--max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B")
  fi
}

# ---- steps: a directory each, with records that vaswani-step keeps. ask SUBCOMMAND WORD...:
# its answer in ANSWER, status 0 (yes) or 3 (no; ANSWER says why); else the script ends.
ask() {
  local status=0
  ANSWER=$(vaswani-step "$@") || status=$?
  [ "$status" = 0 ] || [ "$status" = 3 ] || exit 1
  return "$status"
}

# step_is_current DIR CONFIG [UPSTREAM...]: the step finished with these settings and inputs, its
# outputs intact; step_is_done also logs why not; skip_step_if_done ends the script when done.
# hold_step DIR: no other recipe works in DIR while this one runs (a lock file beside DIR, open
# until the script ends); another is refused, naming the first. share_step DIR: this script
# works in DIR under another process's hold (a training run's nodes other than node 0).
step_is_current() { hold_step "$1"; ask status "$@"; }
hold_step() {
  local fd; [[ "$HELD_STEPS" != *$'\n'"$1"$'\n'* ]] || return 0
  ask lock-path "$1" && exec {fd}>>"$ANSWER" || die "cannot lock $1"
  ask hold "$1" "$fd" "$RECIPE_CALLER" "$STEP_NAME" || die "$ANSWER"; share_step "$1"
}
share_step() { HELD_STEPS+="$1"$'\n'; }
step_is_done() {
  step_is_current "$@" && return 0
  [ -z "$ANSWER" ] || log "redoing the step in $1: $ANSWER"; return 1
}
skip_step_if_done() {
  if step_is_done "$@"; then log "already done ($1/.done); skipping"; exit 0; fi
}

# require_step DIR NAME [ITS_INPUT...]: die unless step NAME finished in DIR (on these inputs).
# step_restart DIR: empty DIR (never one a live training holds). step_begin DIR CONFIG
# [UPSTREAM...]: record how the partial work in DIR starts (.started). step_can_continue: it was
# started with these (why not is logged). step_mark_done DIR CONFIG [UPSTREAM...] -- OUTPUT...
require_step() { ask require "$@" || die "$ANSWER"; }
step_restart() { ask restart "$1" || die "$ANSWER"; }
step_begin() { ask begin "$@" || die "$ANSWER"; }
step_can_continue() { ask can-continue "$@" && return 0; log "$ANSWER"; return 1; }
step_mark_done() { ask done "$@" || die "$ANSWER"; log "done: $1"; }

# begin_training DIR CONFIG [UPSTREAM...]: resume, continue (max_update grew), start over or
# refuse (START_OVER=1 allows it) the training in DIR, and record it; a run already done ends
# the script.
begin_training() {
  local line again=()
  require_flag START_OVER; [ "${START_OVER:-0}" = 0 ] || again=(--start-over); hold_step "$1"
  ask begin-training "${again[@]}" "$@" || die "$ANSWER"
  while IFS= read -r line; do log "$line"; done <<< "${ANSWER%$'\n'*}"
  [ "${ANSWER##*$'\n'}" != done ] || exit 0
}

# binarize_prepared CONFIG SRC TGT [OPTION...]: the binarize step, fairseq-preprocess of the
# splits of $PREP_DIR into $BIN_DIR with $WORKERS workers and these options.
binarize_prepared() {
  local config=$1 src=$2 tgt=$3 split lang outputs=("dict.$2.txt" "dict.$3.txt")
  skip_step_if_done "$BIN_DIR" "$config" "$PREP_DIR"
  ask keep-trained "$BIN_DIR" "$CKPT_DIR" "${START_OVER:-0}" "$ANSWER" || die "$ANSWER"
  require_step "$PREP_DIR" prepare
  log "binarizing $PREP_DIR into $BIN_DIR ($WORKERS workers): ${*:4}"
  step_restart "$BIN_DIR"
  run fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
    --trainpref "$PREP_DIR/train" --validpref "$PREP_DIR/valid" --testpref "$PREP_DIR/test" \
    --destdir "$BIN_DIR" --workers "$WORKERS" "${@:4}"
  for split in train valid test; do
    for lang in "$src" "$tgt"; do outputs+=("$split.$src-$tgt.$lang."{bin,idx}); done
  done
  log "dictionaries: $(wc -l < "$BIN_DIR/dict.$src.txt") $src and" \
    "$(wc -l < "$BIN_DIR/dict.$tgt.txt") $tgt types (+4 special symbols)"
  step_mark_done "$BIN_DIR" "$config" "$PREP_DIR" -- "${outputs[@]}"
}
