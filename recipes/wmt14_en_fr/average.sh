#!/usr/bin/env bash
# WMT14 English-French, Step 4: average the last 5 (base) / 20 (big) interval checkpoints.
# The environment variables it reads are documented in recipes/steps/average.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PAIR_CONFIG="$here/config.sh"
exec bash "$here/../steps/average.sh" "$@"
