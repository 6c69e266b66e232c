"""The precision and optimizer that training on a CUDA GPU uses by default: the one place that
changes when the GPU check's steady-state speed section (docs/gpu_check.md) shows another
combination faster than today's against stock fairseq.

Until a GPU run has measured the plugin's float32-master ``--bf16`` / ``--fp16`` and
``vaswani_adam`` there, these are the recipes' defaults as they were: bf16 on GPUs of compute
capability 8 or more (fp16 below), fairseq's ``adam``. ``python -m user_plugin.training_defaults``
prints ``PRECISION OPTIMIZER`` for the recipes to read.
"""

from __future__ import annotations

from typing import Dict

#: On a CUDA GPU of compute capability >= 8 (A100, H100, H200...).
CUDA_TRAINING_DEFAULTS: Dict[str, str] = {"precision": "bf16", "optimizer": "adam"}
#: Below compute capability 8 (no bfloat16 tensor cores).
CUDA_BEFORE_AMPERE_PRECISION = "fp16"


def main() -> int:
    print(CUDA_TRAINING_DEFAULTS["precision"], CUDA_TRAINING_DEFAULTS["optimizer"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
