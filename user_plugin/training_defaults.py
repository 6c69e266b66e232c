"""The precision and optimizer that training on a CUDA GPU uses by default: the one place that
changes when the GPU check's steady-state speed section (docs/gpu_check.md) shows another
combination faster than today's against stock fairseq.

Until a GPU run has measured the plugin's float32-master ``--bf16`` / ``--fp16`` and
``vaswani_adam`` there, these are the recipes' defaults as they were: bf16 on GPUs of compute
capability 8 or more (fp16 below), fairseq's ``adam``. ``python user_plugin/training_defaults.py
gpu CAPABILITY`` (or ``cpu``) prints ``PRECISION OPTIMIZER`` for a GPU of that compute
capability (major version), or a CPU: the recipes' ``detect_device`` reads it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Dict

#: On a CUDA GPU of compute capability >= 8 (A100, H100, H200...).
CUDA_TRAINING_DEFAULTS: Dict[str, str] = {"precision": "bf16", "optimizer": "adam"}
#: Below compute capability 8 (no bfloat16 tensor cores).
CUDA_BEFORE_AMPERE_PRECISION = "fp16"


def cuda_defaults(capability: int) -> tuple[str, str]:
    """The precision and optimizer of training on a CUDA GPU of compute ``capability``."""
    precision = (CUDA_TRAINING_DEFAULTS["precision"] if capability >= 8
                 else CUDA_BEFORE_AMPERE_PRECISION)
    return precision, CUDA_TRAINING_DEFAULTS["optimizer"]


#: On a CPU: float32, fairseq's ``adam``.
CPU_TRAINING_DEFAULTS = ("fp32", "adam")


def main(argv: Sequence[str] | None = None) -> int:
    """Print ``PRECISION OPTIMIZER`` for ``gpu CAPABILITY`` or ``cpu``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["cpu"]:
        print(*CPU_TRAINING_DEFAULTS)
        return 0
    if len(args) != 2 or args[0] != "gpu" or not args[1].isdigit():
        print("usage: training_defaults.py cpu | gpu CAPABILITY", file=sys.stderr)
        return 2
    print(*cuda_defaults(int(args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
