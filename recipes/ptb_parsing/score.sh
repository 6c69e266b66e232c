#!/usr/bin/env bash
# Parsing step 5, score (paper Table 4): EVALB-compatible bracket F1 (COLLINS.prm conventions,
# vaswani-parse-eval) of the parsed trees against the gold trees. The full EVALB report is
# saved in score/<subset>/evalb.txt (figures also in evalb.json); its summary is printed, with
# the paper's section 23 F1 beside it. The gold tags decide which words are punctuation on both
# sides (--punctuation-from-gold): EVALB would make a sentence whose parse tags a punctuation
# word otherwise an error sentence, left out of the totals, so that a parser's mistakes (and
# fallback trees, tagged XX) would drop out of its score; every sentence EVALB scores keeps
# its figures. Error sentences (none expected) are counted beside F1.
#
# Environment: GEN_SUBSET and WORK_DIR (settings.sh).
set -euo pipefail
STEP_NAME=score
# shellcheck source=settings.sh
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"

report() {
  sed -n '/^=== Summary ===/,$p' "$SCORE_DIR/evalb.txt"
  local f1 errors fallbacks
  f1=$(json_value "$SCORE_DIR/evalb.json" all f1)
  errors=$(json_value "$SCORE_DIR/evalb.json" all error_sentences)
  fallbacks=$(json_value "$GEN_DIR/repairs.json" fallback_trees)
  echo "F1 ($GEN_SUBSET, all sentences): $f1   error sentences: $errors   fallback trees: $fallbacks   paper (WSJ section 23): WSJ only 91.3, semi-supervised 92.7"
}

config="v1 subset=$GEN_SUBSET"
if step_is_done "$SCORE_DIR" "$config" "$GEN_DIR"; then
  log "already done ($SCORE_DIR/.done); skipping"
  report
  exit 0
fi
require_step "$GEN_DIR" generate
step_restart "$SCORE_DIR"
log "scoring $GEN_DIR/parsed.trees against $PREP_DIR/$GEN_SUBSET.gold"
run "$PARSE_EVAL" --gold "$PREP_DIR/$GEN_SUBSET.gold" --pred "$GEN_DIR/parsed.trees" \
  --punctuation-from-gold --json-out "$SCORE_DIR/evalb.json" > "$SCORE_DIR/evalb.txt.tmp"
mv "$SCORE_DIR/evalb.txt.tmp" "$SCORE_DIR/evalb.txt"
report
step_mark_done "$SCORE_DIR" "$config" "$GEN_DIR" -- evalb.txt evalb.json
