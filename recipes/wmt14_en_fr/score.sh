#!/usr/bin/env bash
# WMT14 English-French, Step 6: tokenized BLEU and sacreBLEU of the test translations.
# The environment variables it reads are documented in recipes/steps/score.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PAIR_CONFIG="$here/config.sh"
exec bash "$here/../steps/score.sh" "$@"
