#!/usr/bin/env bash
# Parsing step 2, binarize: fairseq-preprocess the prepared splits into $WORK_DIR/data-bin with
# two dictionaries: the source words (the paper's 16K vocabulary: the SRC_VOCAB most frequent
# training words, the others become <unk>; the output trees get the real words back) and the
# target brackets (every type: labelled brackets and XX). The vocabularies differ, so there is
# no joined dictionary and no --share-all-embeddings.
#
# Environment: SRC_VOCAB [16000], WORKERS [nproc], WORK_DIR (see settings.sh).
set -euo pipefail
STEP_NAME=binarize
# shellcheck source=settings.sh
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
SRC_VOCAB=${SRC_VOCAB:-16000}
WORKERS=${WORKERS:-$(num_cpus)}
require_int SRC_VOCAB
require_int WORKERS

# the source vocabulary: the SRC_VOCAB most frequent training words
binarize_prepared "v1 src_vocab=$SRC_VOCAB" "$SRC" "$TGT" --nwordssrc "$SRC_VOCAB"
