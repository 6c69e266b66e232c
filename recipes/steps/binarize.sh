#!/usr/bin/env bash
# Step 2, binarize: fairseq-preprocess the prepared text into DATA_BIN ($WORK_DIR/data-bin)
# with one dictionary shared by source and target (--joined-dictionary), which the paper's
# shared embedding and pre-softmax weight matrix need (§3.4).
#
#   bash recipes/steps/binarize.sh PAIR     (PAIR: a file of recipes/pairs/, e.g. wmt14_en_de)
#
# Environment: WORK_DIR [work_dirs/<pair>], DATA_BIN [$WORK_DIR/data-bin], WORKERS [nproc].
set -euo pipefail
STEP_NAME=binarize
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
start_pair_run "$@"
WORKERS=${WORKERS:-$(num_cpus)}
require_int WORKERS
S=$SRC_LANG
T=$TGT_LANG

binarize_prepared "v1 $S-$T joined-dictionary" "$S" "$T" --joined-dictionary
