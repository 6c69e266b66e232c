"""The precision and optimizer that training uses by default: on a CUDA GPU, the one place that
changes when the GPU check's steady-state speed section (docs/gpu_check.md) shows another
combination faster than today's against stock fairseq; on a CPU, float32, and for the demo
bfloat16 where the CPU multiplies bf16 matrices in hardware.

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
#: The CPU flags (Linux's /proc/cpuinfo) of bfloat16 matrix products in hardware: AMX tiles and
#: AVX-512's bf16 dot products. Where one is present, the demo trains with ``--bf16`` (bf16
#: weights and activations, float32 master weights).
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """Those of :data:`CPU_BF16_FLAGS` this CPU has (none where ``cpuinfo`` cannot be read,
    as on a machine that is not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.partition(":")[2].split())
                    return [flag for flag in CPU_BF16_FLAGS if flag in flags]
    except OSError:
        pass
    return []


def cpu_detected_defaults() -> tuple[str, str]:
    """The precision and optimizer of training on this CPU: bf16 where it multiplies bf16
    matrices in hardware (:func:`cpu_bf16_flags`), else :data:`CPU_TRAINING_DEFAULTS`."""
    optimizer = CPU_TRAINING_DEFAULTS[1]
    return ("bf16", optimizer) if cpu_bf16_flags() else CPU_TRAINING_DEFAULTS


def main(argv: Sequence[str] | None = None) -> int:
    """Print ``PRECISION OPTIMIZER`` for ``gpu CAPABILITY``, ``cpu`` (the recipes' CPU
    default: float32 on every CPU, so that a run's numbers do not depend on the machine) or
    ``cpu --detect`` (the demo's: :func:`cpu_detected_defaults`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["cpu"]:  # (the recipes pass the capability, 0, after it)
        print(*(cpu_detected_defaults() if "--detect" in args[1:] else CPU_TRAINING_DEFAULTS))
        return 0
    if len(args) != 2 or args[0] != "gpu" or not args[1].isdigit():
        print("usage: training_defaults.py cpu [--detect] | gpu CAPABILITY", file=sys.stderr)
        return 2
    print(*cuda_defaults(int(args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
