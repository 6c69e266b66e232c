"""The precision and optimizer that training uses by default on a CUDA GPU and on a CPU: the one
place that changes when a measurement shows another combination faster.

On a CUDA GPU, until a GPU run has measured the plugin's float32-master ``--bf16`` / ``--fp16``
and ``vaswani_adam`` there (the GPU check's steady-state section, docs/gpu_check.md): bf16 on
compute capability 8 or more, fp16 below, fairseq's ``adam``. On a CPU: bf16 (bf16 weights,
float32 masters) where the CPU multiplies bf16 matrices in hardware (AVX-512 bf16 or AMX), where
it trains the demo's model at 1.34x float32's tokens per second with the same losses
(alternating fairseq-train runs, docs/benchmark.md), and float32 elsewhere; ``vaswani_adam``
(fairseq's update as one fused operation), which made the demo's 150-update runs 1.08x faster
in bf16 and 1.12x in float32 than fairseq's ``adam``, with the same losses.
``python -m user_plugin.training_defaults gpu CAPABILITY`` (or ``cpu``) prints
``PRECISION OPTIMIZER WHY``, WHY being the rest of the line: the recipes' ``detect_device``
reads it and the train step logs WHY. Before it, ``... gpus`` prints the GPUs torch sees and
their lowest compute capability (:func:`visible_gpus`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Dict

from user_plugin.measurement.cpu import BF16_FLAGS, cpu_flags

#: On a CUDA GPU of compute capability >= 8 (A100, H100, H200...).
CUDA_TRAINING_DEFAULTS: Dict[str, str] = {"precision": "bf16", "optimizer": "adam"}
#: Below compute capability 8 (no bfloat16 tensor cores).
CUDA_BEFORE_AMPERE_PRECISION = "fp16"


def cuda_defaults(capability: int) -> tuple[str, str]:
    """The precision and optimizer of training on a CUDA GPU of compute ``capability``."""
    precision = (CUDA_TRAINING_DEFAULTS["precision"] if capability >= 8
                 else CUDA_BEFORE_AMPERE_PRECISION)
    return precision, CUDA_TRAINING_DEFAULTS["optimizer"]


#: On a CPU: the plugin's fused Adam; the precision by :func:`cpu_precision`.
CPU_OPTIMIZER = "vaswani_adam"


def cpu_precision(flags: Sequence[str]) -> tuple[str, str]:
    """The training precision on a CPU with instruction-set ``flags``, and why."""
    units = [flag for flag in flags if flag in BF16_FLAGS]
    if units:
        return "bf16", (f"this CPU multiplies bf16 in hardware ({' '.join(units)}): bf16 weights "
                        "and activations, float32 master weights; PRECISION=fp32 trains in fp32")
    return "fp32", "this CPU has no bf16 matrix instructions (AVX-512 bf16 or AMX)"


#: The device nodes through which a GPU reaches programs: NVIDIA's, ROCm's, WSL's.
GPU_DEVICE_NODES = ("nvidia[0-9]*", "kfd", "dxg")


def visible_gpus(dev: Path = Path("/dev")) -> tuple[int, int]:
    """The number of GPUs torch sees and the major number of their lowest compute capability,
    ``(0, 0)`` for none. torch (3 s to import) is asked only where ``dev`` holds a GPU's device
    node: without one, no GPU can reach torch."""
    if not any(any(dev.glob(pattern)) for pattern in GPU_DEVICE_NODES):
        return 0, 0
    import torch

    count = torch.cuda.device_count()
    return count, min((torch.cuda.get_device_capability(i)[0] for i in range(count)), default=0)


def main(argv: Sequence[str] | None = None) -> int:
    """Print ``VISIBLE_GPUS CAPABILITY`` for ``gpus``, ``PRECISION OPTIMIZER WHY`` for ``gpu
    CAPABILITY`` or ``cpu``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["gpus"]:
        print(*visible_gpus())
        return 0
    if args[:1] == ["cpu"]:
        precision, why = cpu_precision(cpu_flags())
        print(precision, CPU_OPTIMIZER, why)
        return 0
    if len(args) != 2 or args[0] != "gpu" or not args[1].isdigit():
        print("usage: python -m user_plugin.training_defaults gpus | cpu | gpu CAPABILITY",
              file=sys.stderr)
        return 2
    print(*cuda_defaults(int(args[1])), f"a CUDA GPU of compute capability {args[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
