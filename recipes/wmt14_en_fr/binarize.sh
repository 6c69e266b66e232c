#!/usr/bin/env bash
# WMT14 English-French, Step 2: fairseq-preprocess with a joined dictionary.
# The environment variables it reads are documented in recipes/steps/binarize.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PAIR_CONFIG="$here/config.sh"
exec bash "$here/../steps/binarize.sh" "$@"
