"""The paper's training and decoding settings, defined once (Vaswani et al. 2017, §5, §6).

Python code imports these names; the shell recipes read the same values by running this file
(``python user_plugin/paper.py``, or ``python -m user_plugin.paper``), which prints them as
``PAPER_<NAME>='value'`` lines for ``eval``.
Model sizes live with the architectures (``models/architectures.py``), since an architecture
is the paper's definition of a model.
"""

from __future__ import annotations

import sys
from typing import Dict, Tuple

# §5.1: each training step holds about 25,000 source and 25,000 target tokens.
TOKENS_PER_STEP = 25_000
# §5.1: WMT14 EN-FR is split into a vocabulary of 32,000 word pieces.
WORDPIECE_VOCAB = 32_000
# §5.2: base models train for 100,000 steps, big models for 300,000.
BASE_TRAIN_STEPS = 100_000
BIG_TRAIN_STEPS = 300_000
# §5.2: 0.4 s per base step and 1.0 s per big step on 8 P100s; §6.1: a checkpoint every
# 10 minutes, i.e. every 1,500 base steps or 600 big steps.
CHECKPOINT_MINUTES = 10
BASE_STEP_SECONDS = 0.4
BIG_STEP_SECONDS = 1.0
BASE_SAVE_INTERVAL = round(CHECKPOINT_MINUTES * 60 / BASE_STEP_SECONDS)
BIG_SAVE_INTERVAL = round(CHECKPOINT_MINUTES * 60 / BIG_STEP_SECONDS)
# §6.1: average the last 5 (base) or 20 (big) checkpoints.
BASE_AVERAGE_LAST = 5
BIG_AVERAGE_LAST = 20
# §5.3: Adam with beta1 0.9, beta2 0.98, epsilon 1e-9; 4,000 warm-up steps (equation 3).
ADAM_BETAS: Tuple[float, float] = (0.9, 0.98)
ADAM_EPS = 1e-9
WARMUP_STEPS = 4_000
# §5.4: residual dropout P_drop 0.1 (base); Table 3: 0.3 for big EN-DE (§6.1: 0.1 for EN-FR).
DROPOUT = 0.1
BIG_DROPOUT = 0.3
# §5.4: label smoothing epsilon_ls.
LABEL_SMOOTHING = 0.1
# §6.1: beam 4, GNMT length penalty alpha 0.6, at most input length + 50 output tokens.
BEAM = 4
LENPEN = 0.6
MAX_LEN_OVER_SOURCE = 50
# §6.3: constituency parsing decodes with beam 21, alpha 0.3, input length + 300.
PARSING_BEAM = 21
PARSING_LENPEN = 0.3
PARSING_MAX_LEN_OVER_SOURCE = 300


def adam_betas_option() -> str:
    """:data:`ADAM_BETAS` as fairseq's ``--adam-betas`` takes it: ``(0.9,0.98)``."""
    return "(" + ",".join(str(beta) for beta in ADAM_BETAS) + ")"


def shell_assignments() -> Dict[str, str]:
    """Every setting above as ``PAPER_<NAME>`` -> value, in the form shell recipes use."""
    values = {
        name: value
        for name, value in globals().items()
        if name.isupper() and isinstance(value, (int, float, tuple))
    }
    out = {}
    for name, value in values.items():
        if value is ADAM_BETAS:
            value = adam_betas_option()
        elif isinstance(value, tuple):
            value = "(" + ",".join(str(v) for v in value) + ")"
        out[f"PAPER_{name}"] = str(value)
    return out


def main() -> int:
    """Print ``PAPER_<NAME>='value'`` lines, for ``eval "$(python user_plugin/paper.py)"``."""
    for name, value in shell_assignments().items():
        print(f"{name}='{value}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
