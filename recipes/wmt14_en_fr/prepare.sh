#!/usr/bin/env bash
# WMT14 English-French, Step 1: download (or read RAW_DIR), normalise, tokenise, clean and subword-split the text.
# The environment variables it reads are documented in recipes/steps/prepare.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PAIR_CONFIG="$here/config.sh"
exec bash "$here/../steps/prepare.sh" "$@"
