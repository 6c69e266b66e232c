#!/usr/bin/env bash
# The Penn Treebank parsing recipe (paper §6.3, Table 4), every step in order: prepare, binarize,
# train, generate, score. Finished steps are skipped; see each step for its settings.
#
#   PTB_DIR=/data/treebank_3/parsed/mrg recipes/ptb_parsing/run_all.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for step in prepare binarize train generate score; do
  printf '[%s run_all] === %s ===\n' "$(date +%H:%M:%S)" "$step" >&2
  bash "$here/$step.sh"
done
