# shellcheck shell=bash
# Settings shared by the steps of the Penn Treebank parsing recipe (paper §6.3, Table 4), sourced
# by each step: it loads recipes/common.sh and the virtual environment first. Every value can be
# given in the environment.
#
#   WORK_DIR     [work_dirs/ptb_parsing]  everything the recipe writes
#   GEN_SUBSET   [test]                   split to parse and score: test (section 23) or
#                                         valid (section 22, where the paper tuned)
#
# Step directories: prepared/, data-bin/, checkpoints/, generate/<subset>/, score/<subset>/.
# The paper's decoding settings come from user_plugin/paper.py (PAPER_PARSING_*).

# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
activate_venv

WORK_DIR=${WORK_DIR:-$REPO_DIR/work_dirs/ptb_parsing}
mkdir -p "$WORK_DIR"
WORK_DIR=$(cd "$WORK_DIR" && pwd)
GEN_SUBSET=${GEN_SUBSET:-test}
case "$GEN_SUBSET" in
  test|valid) ;;
  *) die "GEN_SUBSET must be test (section 23) or valid (section 22), got '$GEN_SUBSET'" ;;
esac
PREP_DIR="$WORK_DIR/prepared"
BIN_DIR="$WORK_DIR/data-bin"
CKPT_DIR="$WORK_DIR/checkpoints"
GEN_DIR="$WORK_DIR/generate/$GEN_SUBSET"
SCORE_DIR="$WORK_DIR/score/$GEN_SUBSET"
# fairseq's "languages": the source side holds the words, the target side the brackets.
SRC=words
TGT=brackets
PREPARE_TREES=vaswani-prepare-trees
PARSE_EVAL=vaswani-parse-eval

# json_value FILE KEY...: a value from a JSON file (floats with 2 decimals), e.g.
# json_value score/test/evalb.json all f1.
json_value() {
  python - "$@" <<'PY'
import json
import sys

with open(sys.argv[1], encoding="utf-8") as handle:
    value = json.load(handle)
for key in sys.argv[2:]:
    value = value[key]
print(f"{value:.2f}" if isinstance(value, float) else value)
PY
}
