# shellcheck shell=bash
# Shared functions of the recipes (sourced, not run): logging, the virtual environment and the
# paper's settings, language pairs, paths, devices, decoding options, step markers, downloads.
#
# Step markers. A step writes its outputs into its own directory and, only once everything is
# there, a marker "<dir>/.done" listing:
#   id <unique id of this run of the step>
#   config <sha256 of the settings the step ran with>
#   upstream <path> <identity of the input it read: the id of that step's run, or the sha256
#     of a file's content (input_id); the identity is the line's last field, the path may
#     hold spaces>
#   output <size in bytes> <path relative to dir>
# A later run skips the step when the marker exists, the settings are the same, every upstream
# step is still the run it read from, and every output exists with its recorded size. Otherwise
# the step is redone from scratch (its directory is emptied first): a step interrupted half-way,
# or whose outputs were partly deleted, never counts as done. Upstream steps are recognised by
# the id of their run, in the order they are given, not by their path, so a directory of
# finished steps can be moved or copied and stays finished. An input directory made outside the
# recipes (no marker, e.g. a DATA_BIN binarized by hand) is identified by its content instead
# (content_id), so that re-making it in place counts as a change too.
#
# A step that keeps partial work when it is interrupted (training continues from its last
# checkpoint) also records, before it starts, the settings and upstream runs it started with
# in "<dir>/.started" (same format, no outputs): a later run continues that work only when they
# are still the same (step_begin, step_can_continue), and otherwise starts over, saying why.
# A step can require that an upstream step be itself current: require_step refuses one whose
# own input was redone since it ran.

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$RECIPES_DIR/.." && pwd)
PLUGIN_DIR="$REPO_DIR/user_plugin"
SCRIPTS_DIR="$REPO_DIR/scripts"
PREPARE_TEXT=vaswani-prepare-text
PAIRS_DIR="$RECIPES_DIR/pairs"
STEP_NAME=${STEP_NAME:-recipe}

# log MESSAGE...: a timestamped progress line on stderr.
log() {
  printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "$STEP_NAME" "$*" >&2
}

# die MESSAGE...: one error line on stderr, exit status 1.
die() {
  printf '%s: error: %s\n' "$STEP_NAME" "$*" >&2
  exit 1
}

# run COMMAND ARGS...: print the command, then run it.
run() {
  log "+ $*"
  "$@"
}

# num_cpus: the number of CPU cores (fallback 1).
num_cpus() {
  nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1
}

# activate_venv: use $VENV (default <repo>/.venv) when it exists; otherwise the current PATH,
# which must then provide fairseq. An already active virtual environment is kept. Then reads
# the paper's settings (paper_constants).
activate_venv() {
  local venv=${VENV:-$REPO_DIR/.venv}
  if [ -n "${VIRTUAL_ENV:-}" ]; then
    :
  elif [ -f "$venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    set +u; source "$venv/bin/activate"; set -u
  fi
  command -v fairseq-train >/dev/null 2>&1 \
    || die "fairseq-train not found: run scripts/setup_venv.sh (or set VENV to a virtualenv)"
  command -v vaswani-user-dir >/dev/null 2>&1 \
    || die "the vaswani commands are not installed: run scripts/setup_venv.sh (or pip install .)"
  export PYTHONUNBUFFERED=1
  paper_constants
}

# paper_constants: the paper's training and decoding settings as PAPER_<NAME> variables
# (PAPER_BASE_TRAIN_STEPS, PAPER_WARMUP_STEPS, PAPER_BEAM, ...). They are defined once, in
# user_plugin/paper.py, which prints them when run as a script (no fairseq import: fast).
paper_constants() {
  local assignments
  assignments=$(python "$PLUGIN_DIR/paper.py") \
    || die "cannot read the paper's settings (python $PLUGIN_DIR/paper.py failed)"
  eval "$assignments"
}

# require_int NAME: die unless the variable NAME holds a non-negative integer.
require_int() {
  local value=${!1-}
  [[ "$value" =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '$value'"
}

# sha256_of_string TEXT: the sha256 of TEXT.
sha256_of_string() {
  printf '%s' "$1" | sha256sum | cut -d' ' -f1
}

# file_size PATH: its size in bytes.
file_size() {
  wc -c < "$1" | tr -d ' '
}

# require_usable_path NAME: die unless the variable NAME (a path; it may be unset) is one the
# tools can take. Spaces and non-ASCII letters are fine; a line break is not (the step
# records hold one path a line), nor a colon: fairseq splits data directories and checkpoint
# lists (--path a:b) at ':'.
require_usable_path() {
  local value=${!1-}
  case "$value" in
    *$'\n'*) die "$1 must not contain a line break, got '${value//$'\n'/\\n}'" ;;
    *:*) die "$1 must not contain ':' (fairseq splits its data and checkpoint paths there), got '$value'" ;;
  esac
}

# absolute_path PATH: PATH taken from the current directory and normalised (".", "..", "//")
# without resolving symbolic links, as `cd PATH && pwd` gives it; PATH need not exist.
absolute_path() {
  case "$1" in
    /*) realpath -m -s -- "$1" ;;
    *) realpath -m -s -- "$PWD/$1" ;;
  esac
}

# --------------------------------------------------------------------------------------------
# Language pairs: one file each, recipes/pairs/<pair>.sh, setting
#   SRC_LANG, TGT_LANG   the languages (fairseq's suffixes)
#   SUBWORD              bpe (joint BPE, subword-nmt) or sentencepiece
#   BIG_ARCH             the big model's architecture for this pair
#   TRAIN_CORPORA, DEV_SET, TEST_SET   what the prepare step downloads and verifies

# known_pairs: the names of the language pairs, space-separated.
known_pairs() {
  local file
  local -a names=()
  for file in "$PAIRS_DIR"/*.sh; do
    names+=("$(basename "$file" .sh)")
  done
  echo "${names[*]}"
}

# load_pair [PAIR]: read the settings of the language pair PAIR (the argument, else the variable
# PAIR) and set PAIR and PAIR_NAME to its name. A missing or unknown pair is one error line
# naming the known ones.
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

# start_pair_run [PAIR]: the start of a script that works on a language pair: its settings
# (load_pair), the virtual environment and the paper's settings (activate_venv), the step
# directories (setup_paths).
start_pair_run() {
  load_pair "$@"
  activate_venv
  setup_paths
}

# --------------------------------------------------------------------------------------------
# Paths of one language pair's run. Needs SRC_LANG, TGT_LANG, PAIR_NAME (load_pair).

# setup_paths: the directories of the steps, all absolute; nothing is created.
#   WORK_DIR [<repo>/work_dirs/$PAIR_NAME]: PREP_DIR (prepare) and, by default, BIN_DIR
#   BIN_DIR = DATA_BIN [$WORK_DIR/data-bin]: binarize; the data steps serve every model
#   RUN_DIR [$WORK_DIR/$MODEL]: one model's run, MODEL base or big [base]: CKPT_DIR (train),
#     AVG_DIR (average), GEN_DIR (generate), SCORE_DIR (score)
setup_paths() {
  local name
  for name in WORK_DIR DATA_BIN RUN_DIR; do
    require_usable_path "$name"
  done
  WORK_DIR=$(absolute_path "${WORK_DIR:-$REPO_DIR/work_dirs/$PAIR_NAME}")
  MODEL=${MODEL:-base}
  case "$MODEL" in
    base|big) ;;
    *) die "MODEL must be base or big, got '$MODEL'" ;;
  esac
  PREP_DIR="$WORK_DIR/prepared"
  BIN_DIR=$(absolute_path "${DATA_BIN:-$WORK_DIR/data-bin}")
  RUN_DIR=$(absolute_path "${RUN_DIR:-$WORK_DIR/$MODEL}")
  CKPT_DIR="$RUN_DIR/checkpoints"
  AVG_DIR="$RUN_DIR/average"
  GEN_DIR="$RUN_DIR/generate"
  SCORE_DIR="$RUN_DIR/score"
  check_step_dirs
}

# is_within PATH DIR: PATH is DIR or lies below it (both absolute and normalised).
is_within() {
  [ "$1" = "$2" ] || [ "$2" = / ] || [[ "$1" == "$2"/* ]]
}

# check_step_dirs: die unless the step directories are apart: a step empties its directory
# when it is redone, so none may be, or hold, another step's directory, the raw text
# (RAW_DIR), WORK_DIR, the repository or the home directory (DATA_BIN=$WORK_DIR would empty
# the whole work directory at the binarize step).
check_step_dirs() {
  local name other i
  local -a steps=(PREP_DIR BIN_DIR CKPT_DIR AVG_DIR GEN_DIR SCORE_DIR)
  local -a kept=(WORK_DIR "the repository") kept_paths=("$WORK_DIR" "$REPO_DIR")
  if [ -n "${RAW_DIR:-}" ]; then kept+=(RAW_DIR); kept_paths+=("$(absolute_path "$RAW_DIR")"); fi
  if [ -n "${HOME:-}" ]; then kept+=(HOME); kept_paths+=("$(absolute_path "$HOME")"); fi
  for name in "${steps[@]}"; do
    for other in "${steps[@]}"; do
      [ "$name" != "$other" ] || continue
      if is_within "${!other}" "${!name}"; then
        die "the $(step_of "$name") step's directory ${!name} holds the $(step_of "$other") step's ${!other}: choose DATA_BIN, RUN_DIR, WORK_DIR and RAW_DIR apart"
      fi
    done
    for i in "${!kept[@]}"; do
      if is_within "${kept_paths[i]}" "${!name}"; then
        die "the $(step_of "$name") step's directory ${!name} holds ${kept[i]} (${kept_paths[i]}), which it would empty when redone: choose DATA_BIN, RUN_DIR, WORK_DIR and RAW_DIR apart"
      fi
    done
  done
}

# step_of NAME: the step that owns the directory variable NAME.
step_of() {
  case "$1" in
    PREP_DIR) echo prepare ;; BIN_DIR) echo binarize ;; CKPT_DIR) echo train ;;
    AVG_DIR) echo average ;; GEN_DIR) echo generate ;; *) echo score ;;
  esac
}

# require_data_bin DIR [SUBSET...]: die unless DIR holds fairseq-preprocess output of
# SRC_LANG-TGT_LANG: both dictionaries and the binary files of each SUBSET.
require_data_bin() {
  local dir=$1 subset lang file
  shift
  [ -d "$dir" ] || die "$dir does not exist (binarize the data first)"
  local -a files=("dict.$SRC_LANG.txt" "dict.$TGT_LANG.txt")
  for subset in "$@"; do
    for lang in "$SRC_LANG" "$TGT_LANG"; do
      files+=("$subset.$SRC_LANG-$TGT_LANG.$lang.bin" "$subset.$SRC_LANG-$TGT_LANG.$lang.idx")
    done
  done
  for file in "${files[@]}"; do
    [ -f "$dir/$file" ] || die "$dir has no $file (not binarized $SRC_LANG-$TGT_LANG data?)"
  done
}

# model_defaults: the paper's settings that depend on MODEL (Table 3, §5.2, §6.1), unless
# already given: ARCH, MAX_UPDATE, AVERAGE_LAST, SAVE_INTERVAL_UPDATES (a checkpoint every 10
# minutes at the paper's step time). Needs paper_constants (activate_venv).
model_defaults() {
  if [ "$MODEL" = base ]; then
    ARCH=${ARCH:-vaswani_base}
    MAX_UPDATE=${MAX_UPDATE:-$PAPER_BASE_TRAIN_STEPS}
    AVERAGE_LAST=${AVERAGE_LAST:-$PAPER_BASE_AVERAGE_LAST}
    SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$PAPER_BASE_SAVE_INTERVAL}
  else
    ARCH=${ARCH:-$BIG_ARCH}
    MAX_UPDATE=${MAX_UPDATE:-$PAPER_BIG_TRAIN_STEPS}
    AVERAGE_LAST=${AVERAGE_LAST:-$PAPER_BIG_AVERAGE_LAST}
    SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$PAPER_BIG_SAVE_INTERVAL}
  fi
  require_int MAX_UPDATE
  require_int AVERAGE_LAST
  require_int SAVE_INTERVAL_UPDATES
}

# detect_device: DEVICE (gpu|cpu; default gpu when torch sees one), NUM_GPUS, VISIBLE_GPUS (how
# many torch sees), PRECISION (fp16|bf16|fp32; default on GPU bf16 where every visible GPU has
# compute capability >= 8 (A100, H100...), fp16 below; fp32 on CPU) and PRECISION_ARGS,
# fairseq-train's options for it: --fp16 (float16 weights, fp32 master weights and loss scaling;
# CUDA only) or --bf16 (the plugin serves it on GPU and CPU alike by bfloat16 autocast with
# float32 weights and optimizer state: user_plugin/precision.py).
detect_device() {
  local probe capability
  probe=$(python -c 'import torch
n = torch.cuda.device_count()
print(n, min((torch.cuda.get_device_capability(i)[0] for i in range(n)), default=0))' \
    2>/dev/null || echo "0 0")
  read -r VISIBLE_GPUS capability <<< "$probe"
  DEVICE=${DEVICE:-$([ "$VISIBLE_GPUS" -gt 0 ] && echo gpu || echo cpu)}
  case "$DEVICE" in
    gpu)
      [ "$VISIBLE_GPUS" -gt 0 ] || die "DEVICE=gpu but torch sees no GPU"
      NUM_GPUS=${NUM_GPUS:-$VISIBLE_GPUS}
      require_int NUM_GPUS
      [ "$NUM_GPUS" -ge 1 ] && [ "$NUM_GPUS" -le "$VISIBLE_GPUS" ] \
        || die "NUM_GPUS=$NUM_GPUS but torch sees $VISIBLE_GPUS GPU(s)"
      PRECISION=${PRECISION:-$([ "$capability" -ge 8 ] && echo bf16 || echo fp16)}
      ;;
    cpu)
      NUM_GPUS=0
      PRECISION=${PRECISION:-fp32}
      ;;
    *) die "DEVICE must be gpu or cpu, got '$DEVICE'" ;;
  esac
  case "$PRECISION" in
    fp32) PRECISION_ARGS=() ;;
    fp16) PRECISION_ARGS=(--fp16) ;;
    bf16) PRECISION_ARGS=(--bf16) ;;
    *) die "PRECISION must be fp16, bf16 or fp32, got '$PRECISION'" ;;
  esac
  if [ "$DEVICE" = cpu ] && [ "$PRECISION" = fp16 ]; then
    die "PRECISION=fp16 needs a GPU (fairseq's --fp16 needs CUDA); use PRECISION=bf16 or fp32"
  fi
}

# --------------------------------------------------------------------------------------------
# Decoding (paper §6.1), shared by the generate step and the ablation's dev-set BLEU.

# decoding_defaults: unless already given, BEAM and LENPEN (alpha of the length penalty), the
# paper's; MAX_LEN_A and MAX_LEN_B, the output length bound MAX_LEN_A x source + MAX_LEN_B
# (the paper: source + 50); SUBWORD_POST_PROCESS, fairseq's name for undoing the pair's
# subwords (subword_nmt | sentencepiece). Needs paper_constants and load_pair.
decoding_defaults() {
  BEAM=${BEAM:-$PAPER_BEAM}
  LENPEN=${LENPEN:-$PAPER_LENPEN}
  MAX_LEN_A=${MAX_LEN_A:-1}
  MAX_LEN_B=${MAX_LEN_B:-$PAPER_MAX_LEN_OVER_SOURCE}
  require_int BEAM
  require_int MAX_LEN_B
  case "$SUBWORD" in
    bpe) SUBWORD_POST_PROCESS=subword_nmt ;;
    sentencepiece) SUBWORD_POST_PROCESS=sentencepiece ;;
    *) die "the pair's SUBWORD must be bpe or sentencepiece, got '$SUBWORD'" ;;
  esac
}

# inference_args: INFERENCE_ARGS, the options fairseq-validate and fairseq-generate share: the
# plugin, TASK, no sentence dropped by batching, DEVICE.
inference_args() {
  INFERENCE_ARGS=(--user-dir "$PLUGIN_DIR" --task "$TASK" --required-batch-size-multiple 1)
  if [ "$DEVICE" = cpu ]; then
    INFERENCE_ARGS+=(--cpu)
  fi
}

# decoding_args: DECODING_ARGS, fairseq-generate's options for the beam search of TASK with
# BEAM and LENPEN (and INFERENCE_ARGS). The task vaswani_translation ranks hypotheses by the
# paper's GNMT penalty ((5+|Y|)/6)^alpha and bounds each sentence by its own source length +
# MAX_LEN_B (MAX_LEN_A is 1 there); fairseq's own tasks (TASK=translation) use |Y|^alpha and
# bound a whole batch by MAX_LEN_A x its longest source + MAX_LEN_B.
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

# --------------------------------------------------------------------------------------------
# Step markers

# step_config_hash TEXT: the fingerprint of a step's settings, stored in its marker.
step_config_hash() {
  sha256_of_string "$1"
}

# marker_id DIR: the id in DIR/.done (empty when there is no marker).
marker_id() {
  [ -f "$1/.done" ] || return 0
  awk '$1 == "id" { print $2; exit }' "$1/.done"
}

# content_id DIR: a fingerprint of the files directly in DIR (names, sizes, and the sha256 of
# each file up to 16 MiB: dictionaries, indexes, codes), independent of DIR's path.
content_id() {
  local dir=$1 file size LC_ALL=C
  {
    for file in "$dir"/*; do
      [ -f "$file" ] || continue
      size=$(file_size "$file")
      printf '%s %s' "$(basename "$file")" "$size"
      [ "$size" -gt 16777216 ] || printf ' %s' "$(sha256sum < "$file" | cut -d' ' -f1)"
      printf '\n'
    done
  } | sha256sum | cut -c1-32 | sed 's/^/content-/'
}

# input_id PATH: the identity of an input: for a directory, the id of the step run that made
# it (marker_id), else, for a directory made outside the recipes, its content_id; for a file
# (the raw text a step reads), the sha256 of its whole content; empty when PATH does not exist.
input_id() {
  if [ -f "$1/.done" ]; then
    marker_id "$1"
  elif [ -d "$1" ]; then
    content_id "$1"
  elif [ -f "$1" ]; then
    printf 'sha256-%s' "$(sha256sum < "$1" | cut -d' ' -f1)"
  fi
}

# step_outputs_ok DIR: the marker exists and every output it lists has its recorded size.
# On failure prints the reason on stdout.
step_outputs_ok() {
  local dir=$1 kind a b
  [ -f "$dir/.done" ] || { echo "no marker $dir/.done"; return 1; }
  while read -r kind a b; do
    if [ "$kind" = output ]; then
      [ -f "$dir/$b" ] || { echo "output $dir/$b is missing"; return 1; }
      [ "$(file_size "$dir/$b")" = "$a" ] || { echo "output $dir/$b has changed size"; return 1; }
    fi
  done < "$dir/.done"
}

# record_matches FILE CONFIG [UPSTREAM_DIR...]: FILE (a .done or .started record) holds these
# settings and, in this order, the ids of the upstream steps' current runs. On failure prints
# the reason on stdout.
record_matches() {
  local file=$1 config=$2
  shift 2
  if [ "$(awk '$1 == "config" { print $2; exit }' "$file")" != "$(step_config_hash "$config")" ]; then
    echo "its settings changed"
    return 1
  fi
  record_inputs_match "$file" "$@"
}

# record_inputs_match FILE [UPSTREAM_DIR...]: FILE records, in this order, the identities
# (input_id) that these upstream directories have now. On failure prints the reason on stdout.
record_inputs_match() {
  local file=$1 upstream i=0
  shift
  local -a recorded=()
  # the identity is the last field: the path before it may hold spaces
  mapfile -t recorded < <(awk '$1 == "upstream" { print $NF }' "$file")
  if [ "${#recorded[@]}" -ne "$#" ]; then
    echo "it now reads other inputs"
    return 1
  fi
  for upstream in "$@"; do
    if [ -z "${recorded[i]}" ] || [ "${recorded[i]}" != "$(input_id "$upstream")" ]; then
      echo "its input $upstream was redone or changed"
      return 1
    fi
    i=$((i + 1))
  done
}

# step_is_done DIR CONFIG [UPSTREAM_DIR...]: true when the step in DIR finished with these
# settings on the current runs of its upstream steps and its outputs are intact. The reason it
# is not done is logged.
step_is_done() {
  local dir=$1 reason
  if ! reason=$(step_outputs_ok "$dir"); then
    [ -f "$dir/.done" ] && log "redoing the step in $dir: $reason"
    return 1
  fi
  if ! reason=$(record_matches "$dir/.done" "${@:2}"); then
    log "redoing the step in $dir: $reason"
    return 1
  fi
}

# skip_step_if_done DIR CONFIG [UPSTREAM_DIR...]: end the script, saying so, when the step in
# DIR is done (step_is_done): a rerun of finished work changes nothing.
skip_step_if_done() {
  if step_is_done "$@"; then
    log "already done ($1/.done); skipping"
    exit 0
  fi
}

# require_step UPSTREAM_DIR NAME [ITS_INPUT_DIR...]: die unless the step NAME finished in
# UPSTREAM_DIR and, when its own input directories are given, read them as they are now (none
# was redone since it ran).
require_step() {
  local reason
  reason=$(step_outputs_ok "$1") || die "run the $2 step first ($reason)"
  if [ $# -gt 2 ] && ! reason=$(record_inputs_match "$1/.done" "${@:3}"); then
    die "run the $2 step again: $reason since it ran"
  fi
}

# dir_in_use DIR: true when a live training run holds DIR (the lock of user_plugin's
# training_run module, an flock on DIR/.vaswani-train.lock); prints the holder.
dir_in_use() {
  local lock="$1/.vaswani-train.lock"
  [ -f "$lock" ] && command -v flock >/dev/null 2>&1 || return 1
  if flock -n "$lock" true 2>/dev/null; then
    return 1
  fi
  head -n 1 "$lock" 2>/dev/null || true
}

# step_restart DIR: empty DIR (a partial step is redone from scratch); never the directory of
# a training run that is still going on.
step_restart() {
  local holder
  if holder=$(dir_in_use "$1"); then
    die "$1 is in use by a training run that is still going on (${holder:-holder unknown}); wait for it to end"
  fi
  rm -rf "$1"
  mkdir -p "$1"
}

# write_record DIR KIND CONFIG [UPSTREAM_DIR...] -- [OUTPUT...]: write DIR/.KIND (done or
# started) atomically: a new id, the settings' fingerprint, the upstream runs' ids and, for a
# finished step, the outputs' sizes (paths relative to DIR; there must be at least one).
write_record() {
  local dir=$1 kind=$2 config=$3 out
  shift 3
  local -a upstreams=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do upstreams+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  if [ "$kind" = done ]; then
    [ $# -gt 0 ] || die "internal: step_mark_done without outputs"
  fi
  {
    if [ "$kind" = done ]; then
      echo "# written when the step finished; delete this file to redo the step"
    else
      echo "# written when the step started: its partial work is continued with these only"
    fi
    echo "id $(date +%Y%m%dT%H%M%S)-$$-$RANDOM"
    echo "config $(step_config_hash "$config")"
    for out in "${upstreams[@]}"; do echo "upstream $out $(input_id "$out")"; done
    for out in "$@"; do
      [ -f "$dir/$out" ] || die "internal: step output $dir/$out was not written"
      echo "output $(file_size "$dir/$out") $out"
    done
  } > "$dir/.$kind.tmp"
  mv "$dir/.$kind.tmp" "$dir/.$kind"
}

# step_mark_done DIR CONFIG [UPSTREAM_DIR...] -- OUTPUT...: write DIR/.done (atomically) once
# the outputs (paths relative to DIR) all exist; the record of the started run goes.
step_mark_done() {
  write_record "$1" done "${@:2}"
  rm -f "$1/.started"
  log "done: $1"
}

# step_begin DIR CONFIG [UPSTREAM_DIR...]: record in DIR/.started (DIR is created) the settings
# and upstream runs a step that keeps partial work is starting (or continuing) with.
step_begin() {
  mkdir -p "$1"
  write_record "$1" started "${@:2}" --
}

# step_can_continue DIR CONFIG [UPSTREAM_DIR...]: true when the partial work in DIR was started
# (step_begin) with these settings on the current runs of these upstream steps. The reason it
# cannot be continued is logged.
step_can_continue() {
  local reason
  [ -f "$1/.started" ] || { log "no record of how the work in $1 was started"; return 1; }
  if ! reason=$(record_matches "$1/.started" "${@:2}"); then
    log "the unfinished work in $1 cannot be continued: $reason"
    return 1
  fi
}

# binarize_prepared CONFIG SRC TGT [FAIRSEQ_PREPROCESS_OPTION...]: the binarize step of a
# recipe: fairseq-preprocess the train, valid and test splits of $PREP_DIR into $BIN_DIR
# (emptied first) with these options and $WORKERS workers, then mark the step done with CONFIG.
# Skipped when that is already done; the prepare step must be.
binarize_prepared() {
  local config=$1 src=$2 tgt=$3 outputs
  skip_step_if_done "$BIN_DIR" "$config" "$PREP_DIR"
  require_step "$PREP_DIR" prepare
  log "binarizing $PREP_DIR into $BIN_DIR ($WORKERS workers): ${*:4}"
  step_restart "$BIN_DIR"
  run fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
    --trainpref "$PREP_DIR/train" --validpref "$PREP_DIR/valid" --testpref "$PREP_DIR/test" \
    --destdir "$BIN_DIR" --workers "$WORKERS" "${@:4}"
  mapfile -t outputs < <(preprocess_outputs "$src" "$tgt")
  log "dictionaries: $(wc -l < "$BIN_DIR/dict.$src.txt") $src and" \
    "$(wc -l < "$BIN_DIR/dict.$tgt.txt") $tgt types (+4 special symbols)"
  step_mark_done "$BIN_DIR" "$config" "$PREP_DIR" -- "${outputs[@]}"
}

# preprocess_outputs SRC TGT: the files fairseq-preprocess writes for the pair with train, valid
# and test splits (paths relative to its --destdir), one per line.
preprocess_outputs() {
  local split lang
  echo "dict.$1.txt"
  echo "dict.$2.txt"
  for split in train valid test; do
    for lang in "$1" "$2"; do
      echo "$split.$1-$2.$lang.bin"
      echo "$split.$1-$2.$lang.idx"
    done
  done
}

# has_checkpoints DIR: DIR holds checkpoints a fairseq-train run would resume from.
has_checkpoints() {
  compgen -G "$1/checkpoint*.pt" >/dev/null
}

# begin_training DIR CONFIG [UPSTREAM_DIR...]: make DIR ready for a fairseq-train run with these
# settings and upstream runs, and record them (.started). Its checkpoints are resumed only when
# they were started with the same (a kill, a reboot); a finished run (.done with other
# settings), checkpoints without a record, or a record of other settings or data start over.
# Never touches the directory of a training run that is still going on.
begin_training() {
  local dir=$1 holder
  if holder=$(dir_in_use "$dir"); then
    die "$dir is in use by a training run that is still going on (${holder:-holder unknown}); wait for it to end"
  fi
  if [ -f "$dir/.done" ]; then
    log "starting over in $dir"
    step_restart "$dir"
  elif ! has_checkpoints "$dir"; then
    mkdir -p "$dir"
  elif [ ! -f "$dir/.started" ]; then
    log "starting over in $dir: its checkpoints have no record of the settings and data they were trained with (no .started; a deleted .done redoes the step)"
    step_restart "$dir"
  elif step_can_continue "$@"; then
    log "resuming in $dir (from its newest intact checkpoint)"
  else
    log "starting over in $dir"
    step_restart "$dir"
  fi
  step_begin "$@"
}

# --------------------------------------------------------------------------------------------
# Downloads

# download URL DEST [SIZE SHA256]: fetch URL into DEST unless DEST is already complete. A partial
# download (DEST.part) is continued. With SIZE and SHA256 the file is checked against them;
# otherwise it must be non-empty. A file that fails the check is removed.
download() {
  local url=$1 dest=$2 size=${3:-} sha=${4:-}
  if [ -f "$dest" ]; then
    log "already downloaded: $dest"
    return 0
  fi
  mkdir -p "$(dirname "$dest")"
  log "downloading $url"
  if command -v wget >/dev/null 2>&1; then
    wget -q --show-progress -c -O "$dest.part" "$url" || die "download failed: $url"
  elif command -v curl >/dev/null 2>&1; then
    curl -fL --retry 3 -C - -o "$dest.part" "$url" || die "download failed: $url"
  else
    die "neither wget nor curl is installed"
  fi
  [ -s "$dest.part" ] || { rm -f "$dest.part"; die "empty download: $url"; }
  if [ -n "$size" ]; then
    local got_size
    got_size=$(file_size "$dest.part")
    [ "$got_size" = "$size" ] || { rm -f "$dest.part"; die "$url: $got_size bytes, expected $size"; }
  fi
  if [ -n "$sha" ]; then
    local got
    got=$(sha256sum "$dest.part" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { rm -f "$dest.part"; die "$url: sha256 $got, expected $sha"; }
    log "verified sha256 of $(basename "$dest")"
  fi
  mv "$dest.part" "$dest"
}

# download_md5 URL DEST MD5: as download, checked against an md5 sum.
download_md5() {
  local url=$1 dest=$2 md5=$3 got
  if [ -f "$dest" ]; then
    log "already downloaded: $dest"
  else
    download "$url" "$dest.unverified"
    got=$(md5sum "$dest.unverified" | cut -d' ' -f1)
    [ "$got" = "$md5" ] || { rm -f "$dest.unverified"; die "$url: md5 $got, expected $md5"; }
    mv "$dest.unverified" "$dest"
    log "verified md5 of $(basename "$dest")"
  fi
}

# archive_member ARCHIVE MEMBER: the member's contents on stdout (.tgz, .tar; .gz members are
# decompressed).
archive_member() {
  local archive=$1 member=$2
  case "$member" in
    *.gz) tar -xOf "$archive" "$member" | gunzip -c ;;
    *) tar -xOf "$archive" "$member" ;;
  esac
}

# append_parallel ARCHIVE SRC_MEMBER TGT_MEMBER OUT_SRC OUT_TGT: append one corpus of an
# archive to the training text after checking that its two sides have the same line count.
append_parallel() {
  local archive=$1 src_member=$2 tgt_member=$3 out_src=$4 out_tgt=$5 tmp
  tmp=$(dirname "$out_src")/.corpus
  archive_member "$archive" "$src_member" > "$tmp.src" || die "cannot read $src_member from $archive"
  archive_member "$archive" "$tgt_member" > "$tmp.tgt" || die "cannot read $tgt_member from $archive"
  local n
  n=$("$PREPARE_TEXT" check-lines "$tmp.src" "$tmp.tgt") \
    || die "$archive: $src_member and $tgt_member are not parallel"
  log "$(basename "$archive"): $src_member + $tgt_member: $n pairs"
  cat "$tmp.src" >> "$out_src"
  cat "$tmp.tgt" >> "$out_tgt"
  rm -f "$tmp.src" "$tmp.tgt"
}
