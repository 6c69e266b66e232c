"""fairseq-generate as the speed comparisons run it: the same beam, penalty weight and batches
for stock fairseq and for our model, so that their ratio is the model's and the plugin's alone.

* ``builtin``: stock fairseq-generate (no ``--user-dir``) on the export to fairseq's
  ``transformer``: fairseq's ``|Y|^alpha`` penalty and its batch-wide length limit
  (``--max-len-a 1 --max-len-b 50``);
* ``ours``: our checkpoint with the plugin's task, the paper's exact decoder (GNMT penalty, each
  output at most its source + 50);
* ``ours-fairseq-rules``: our checkpoint searching by ``builtin``'s rules
  (``--length-penalty-form fairseq --max-len-over-source -1`` and the same length limit).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List

from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE

FAIRSEQ_ENGINES = ("builtin", "ours", "ours-fairseq-rules")
USER_DIR = Path(__file__).resolve().parents[1]


def generate_arguments(engine: str, data_dir: Path, model: Path, subset: str,
                       batch_size: int) -> List[str]:
    """fairseq-generate's arguments (after the program) for ``engine`` decoding ``model``."""
    if engine not in FAIRSEQ_ENGINES:
        raise ValueError(f"not a fairseq-generate engine: {engine!r}")
    argv = [str(data_dir), "--path", str(model), "--gen-subset", subset, "--beam", str(BEAM),
            "--lenpen", str(LENPEN), "--batch-size", str(batch_size),
            "--required-batch-size-multiple", "1"]
    if engine.startswith("ours"):
        argv += ["--user-dir", str(USER_DIR), "--task", "vaswani_translation"]
    if engine == "ours-fairseq-rules":
        argv += ["--length-penalty-form", "fairseq", "--max-len-over-source", "-1"]
    if engine != "ours":
        argv += ["--max-len-a", "1", "--max-len-b", str(MAX_LEN_OVER_SOURCE)]
    return argv


def generate_environment(engine: str, threads: int) -> Dict[str, str]:
    """The environment of one run: ``threads`` OpenMP/MKL threads; the stock export (a
    Namespace checkpoint, as stock fairseq writes them) loaded without torch's weights-only
    restriction."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if engine == "builtin":
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    return env
