#!/usr/bin/env bash
# WMT14 English-German, Step 5: translate newstest2014 with beam 4, alpha 0.6; detokenise.
# The environment variables it reads are documented in recipes/steps/generate.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PAIR_CONFIG="$here/config.sh"
exec bash "$here/../steps/generate.sh" "$@"
