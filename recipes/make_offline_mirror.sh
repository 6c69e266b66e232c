#!/usr/bin/env bash
# Build a small local RAW_DIR mirror (the layout recipes/steps/prepare.sh reads) from the real
# sample data in ../shared/data, so the WMT14 recipes run offline (CI, laptops):
#
#   recipes/make_offline_mirror.sh en-de   # train: Multi30k train (29000 pairs)
#                                          # valid: newstest2013 (3000), test: newstest2014 (3003)
#   recipes/make_offline_mirror.sh en-fr   # newstest2014 en-fr (3003) split in three:
#                                          # train: the first 2003, valid: 500, test: the last 500
#
# The result is $RAW_DIR/{train,valid,test}.{en,de|fr} plus README.txt. It is not WMT14 training
# data: it exercises the pipeline, it does not reproduce the paper's scores.
#
# Environment: RAW_DIR [work_dirs/offline_mirror/<pair>], SHARED_DATA [<repo>/../shared/data],
# FR_VALID_LINES [500], FR_TEST_LINES [500]. An existing complete mirror is left as it is.
set -euo pipefail
STEP_NAME=mirror
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pair=${1:-en-de}
case "$pair" in
  en-de|en-fr) ;;
  *) die "usage: $0 en-de|en-fr (got '$pair')" ;;
esac
tgt=${pair#en-}
SHARED_DATA=${SHARED_DATA:-$REPO_DIR/../shared/data}
[ ! -d "$SHARED_DATA" ] || SHARED_DATA=$(cd "$SHARED_DATA" && pwd)
RAW_DIR=${RAW_DIR:-$REPO_DIR/work_dirs/offline_mirror/$pair}
FR_VALID_LINES=${FR_VALID_LINES:-500}
FR_TEST_LINES=${FR_TEST_LINES:-500}
require_int FR_VALID_LINES
require_int FR_TEST_LINES
activate_venv  # vaswani-prepare-text

# source files: "split|source file|target file|first line|last line (0 = to the end)"
if [ "$pair" = en-de ]; then
  m30k="$SHARED_DATA/multi30k-en-de"
  nt13="$SHARED_DATA/newstest2013-en-de"
  nt14="$SHARED_DATA/newstest2014-en-de"
  parts=(
    "train|$m30k/train.en|$m30k/train.de|1|0"
    "valid|$nt13/newstest2013.en|$nt13/newstest2013.de|1|0"
    "test|$nt14/newstest2014.en|$nt14/newstest2014.de|1|0"
  )
else
  nt14="$SHARED_DATA/newstest2014-en-fr"
  total=3003
  n_train=$(( total - FR_VALID_LINES - FR_TEST_LINES ))
  [ "$n_train" -gt 0 ] || die "FR_VALID_LINES + FR_TEST_LINES must leave training lines (of $total)"
  parts=(
    "train|$nt14/newstest2014.en|$nt14/newstest2014.fr|1|$n_train"
    "valid|$nt14/newstest2014.en|$nt14/newstest2014.fr|$(( n_train + 1 ))|$(( n_train + FR_VALID_LINES ))"
    "test|$nt14/newstest2014.en|$nt14/newstest2014.fr|$(( n_train + FR_VALID_LINES + 1 ))|0"
  )
fi
config="v1 $pair $(printf '%s ' "${parts[@]}")"

if step_is_done "$RAW_DIR" "$config"; then
  log "mirror already complete: $RAW_DIR"
  exit 0
fi
if [ -d "$RAW_DIR" ] && [ ! -f "$RAW_DIR/.done" ] && [ -n "$(ls -A "$RAW_DIR")" ] \
   && [ ! -f "$RAW_DIR/README.txt" ]; then
  die "$RAW_DIR exists and is not an offline mirror: choose another RAW_DIR"
fi
[ -d "$SHARED_DATA" ] || die "$SHARED_DATA not found (set SHARED_DATA to the folder with the sample data)"
for entry in "${parts[@]}"; do
  IFS='|' read -r _ src_file tgt_file _ _ <<< "$entry"
  for file in "$src_file" "$tgt_file"; do
    [ -f "$file" ] || die "$file not found (set SHARED_DATA to the folder with the sample data)"
  done
done

log "building the $pair mirror in $RAW_DIR from $SHARED_DATA"
partial="$RAW_DIR.partial"
step_restart "$partial"
{
  echo "Offline mirror of the WMT14 recipe's raw text ($pair), built by recipes/make_offline_mirror.sh"
  echo "from $SHARED_DATA. Layout: {train,valid,test}.{en,$tgt}, plain UTF-8, line-aligned."
} > "$partial/README.txt"
outputs=(README.txt)
for entry in "${parts[@]}"; do
  IFS='|' read -r split src_file tgt_file first last <<< "$entry"
  for side in en "$tgt"; do
    if [ "$side" = en ]; then file=$src_file; else file=$tgt_file; fi
    if [ "$last" -eq 0 ]; then
      tail -n "+$first" "$file" > "$partial/$split.$side"
    else
      sed -n "${first},${last}p" "$file" > "$partial/$split.$side"
    fi
    outputs+=("$split.$side")
  done
  n=$("$PREPARE_TEXT" check-lines "$partial/$split.en" "$partial/$split.$tgt") \
    || die "$split: the two sides differ in length"
  echo "$split.{en,$tgt}: lines $first..$(( first + n - 1 )) of $src_file (and .$tgt), $n pairs" \
    >> "$partial/README.txt"
  log "$split: $n pairs"
done
step_mark_done "$partial" "$config" -- "${outputs[@]}"
rm -rf "$RAW_DIR"
mv "$partial" "$RAW_DIR"
log "mirror ready: RAW_DIR=$RAW_DIR"
