# shellcheck shell=bash
# Shared functions of the recipes (sourced, not run): logging, the virtual environment, paths,
# downloads with verification, and step markers.
#
# Step markers. A step writes its outputs into its own directory and, only once everything is
# there, a marker "<dir>/.done" listing:
#   id <unique id of this run of the step>
#   config <sha256 of the settings the step ran with>
#   upstream <dir> <id of the upstream step's run it read from>
#   output <size in bytes> <path relative to dir>
# A later run skips the step when the marker exists, the settings are the same, every upstream
# step is still the run it read from, and every output exists with its recorded size. Otherwise
# the step is redone from scratch (its directory is emptied first): a step interrupted half-way,
# or whose outputs were partly deleted, never counts as done.

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$RECIPES_DIR/.." && pwd)
PLUGIN_DIR="$REPO_DIR/user_plugin"
SCRIPTS_DIR="$REPO_DIR/scripts"
PREPARE_TEXT="$SCRIPTS_DIR/prepare_text.py"
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
# which must then provide fairseq. An already active virtual environment is kept.
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
  export PYTHONUNBUFFERED=1
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

# --------------------------------------------------------------------------------------------
# Paths of one language pair's run. Needs SRC_LANG, TGT_LANG, PAIR_NAME (from a pair config).

# setup_paths: WORK_DIR (default <repo>/work_dirs/$PAIR_NAME) and the step directories.
# The data steps are shared by all models; MODEL (base|big) has its own run directory.
setup_paths() {
  WORK_DIR=${WORK_DIR:-$REPO_DIR/work_dirs/$PAIR_NAME}
  mkdir -p "$WORK_DIR"
  WORK_DIR=$(cd "$WORK_DIR" && pwd)
  MODEL=${MODEL:-base}
  case "$MODEL" in
    base|big) ;;
    *) die "MODEL must be base or big, got '$MODEL'" ;;
  esac
  PREP_DIR="$WORK_DIR/prepared"
  BIN_DIR="$WORK_DIR/data-bin"
  RUN_DIR="$WORK_DIR/$MODEL"
  CKPT_DIR="$RUN_DIR/checkpoints"
  AVG_DIR="$RUN_DIR/average"
  GEN_DIR="$RUN_DIR/generate"
  SCORE_DIR="$RUN_DIR/score"
}

# model_defaults: paper settings that depend on MODEL (Table 3, §5.4, §6.1).
# Sets ARCH, MAX_UPDATE, AVERAGE_LAST, SAVE_INTERVAL_UPDATES unless already given.
model_defaults() {
  if [ "$MODEL" = base ]; then
    ARCH=${ARCH:-vaswani_base}
    MAX_UPDATE=${MAX_UPDATE:-100000}
    AVERAGE_LAST=${AVERAGE_LAST:-5}
    # The paper saves every 10 minutes: 1500 steps at its 0.4 s per base step.
    SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-1500}
  else
    ARCH=${ARCH:-$BIG_ARCH}
    MAX_UPDATE=${MAX_UPDATE:-300000}
    AVERAGE_LAST=${AVERAGE_LAST:-20}
    # 600 steps at 1.0 s per big step.
    SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-600}
  fi
  require_int MAX_UPDATE
  require_int AVERAGE_LAST
  require_int SAVE_INTERVAL_UPDATES
}

# detect_device: DEVICE (gpu|cpu; default gpu when torch sees one) and NUM_GPUS.
detect_device() {
  local visible
  visible=$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  DEVICE=${DEVICE:-$([ "$visible" -gt 0 ] && echo gpu || echo cpu)}
  case "$DEVICE" in
    gpu)
      [ "$visible" -gt 0 ] || die "DEVICE=gpu but torch sees no GPU"
      NUM_GPUS=${NUM_GPUS:-$visible}
      require_int NUM_GPUS
      [ "$NUM_GPUS" -ge 1 ] && [ "$NUM_GPUS" -le "$visible" ] \
        || die "NUM_GPUS=$NUM_GPUS but torch sees $visible GPU(s)"
      PRECISION=${PRECISION:-fp16}
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
  if [ "$DEVICE" = cpu ] && [ "$PRECISION" != fp32 ]; then
    die "PRECISION=$PRECISION needs a GPU (fairseq's fp16/bf16 fail on CPU); use PRECISION=fp32"
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

# step_is_done DIR CONFIG [UPSTREAM_DIR...]: true when the step in DIR finished with these
# settings on the current runs of its upstream steps and its outputs are intact. The reason it
# is not done is logged.
step_is_done() {
  local dir=$1 config=$2 reason kind a b
  shift 2
  if ! reason=$(step_outputs_ok "$dir"); then
    [ -f "$dir/.done" ] && log "redoing the step: $reason"
    return 1
  fi
  if [ "$(awk '$1 == "config" { print $2; exit }' "$dir/.done")" != "$(step_config_hash "$config")" ]; then
    log "redoing the step: its settings changed"
    return 1
  fi
  local upstream
  for upstream in "$@"; do
    a=$(awk -v d="$upstream" '$1 == "upstream" && $2 == d { print $3; exit }' "$dir/.done")
    if [ -z "$a" ] || [ "$a" != "$(marker_id "$upstream")" ]; then
      log "redoing the step: its input $upstream was redone"
      return 1
    fi
  done
  return 0
}

# require_step UPSTREAM_DIR NAME: die unless the step NAME finished in UPSTREAM_DIR.
require_step() {
  local reason
  reason=$(step_outputs_ok "$1") || die "run the $2 step first ($reason)"
}

# step_restart DIR: empty DIR (a partial step is redone from scratch).
step_restart() {
  rm -rf "$1"
  mkdir -p "$1"
}

# step_mark_done DIR CONFIG [UPSTREAM_DIR...] -- OUTPUT...: write DIR/.done (atomically) once
# the outputs (paths relative to DIR) all exist.
step_mark_done() {
  local dir=$1 config=$2 out
  shift 2
  local -a upstreams=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do upstreams+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  [ $# -gt 0 ] || die "internal: step_mark_done without outputs"
  {
    echo "# written when the step finished; delete this file to redo the step"
    echo "id $(date +%Y%m%dT%H%M%S)-$$-$RANDOM"
    echo "config $(step_config_hash "$config")"
    for out in "${upstreams[@]}"; do echo "upstream $out $(marker_id "$out")"; done
    for out in "$@"; do
      [ -f "$dir/$out" ] || die "internal: step output $dir/$out was not written"
      echo "output $(file_size "$dir/$out") $out"
    done
  } > "$dir/.done.tmp"
  mv "$dir/.done.tmp" "$dir/.done"
  log "done: $dir"
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
  n=$(python "$PREPARE_TEXT" check-lines "$tmp.src" "$tmp.tgt") \
    || die "$archive: $src_member and $tgt_member are not parallel"
  log "$(basename "$archive"): $src_member + $tgt_member: $n pairs"
  cat "$tmp.src" >> "$out_src"
  cat "$tmp.tgt" >> "$out_tgt"
  rm -f "$tmp.src" "$tmp.tgt"
}
