#!/usr/bin/env bash
# WMT14 English-German, Step 3: train the base or big Transformer (MODEL=base|big) with the paper's settings.
# The environment variables it reads are documented in recipes/steps/train.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PAIR_CONFIG="$here/config.sh"
exec bash "$here/../steps/train.sh" "$@"
