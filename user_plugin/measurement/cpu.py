"""The CPU a measurement ran on, and its own matrix-multiply peak: the denominator of a CPU
efficiency figure.

Machines differ (one has AVX-512 with bf16 instructions and AMX, another no AVX-512 at all), so a
training speed in tokens per second says little on its own. Divided by the peak the same torch
build reaches on the same machine in the same run, a large square matrix product, it says how
close to the machine the training runs, whatever the machine.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    import torch

# the instruction-set flags of /proc/cpuinfo that decide matrix-product speed
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
# those that multiply bfloat16 matrices in hardware
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpuinfo_lines() -> List[str]:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> List[str]:
    """Those of :data:`SPEED_FLAGS` the CPU reports, in that order."""
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in SPEED_FLAGS if flag in present]
    return []


def has_bf16_instructions() -> bool:
    """Whether the CPU multiplies bfloat16 matrices in hardware (AVX-512 bf16 or AMX)."""
    return bool(set(BF16_FLAGS) & set(cpu_flags()))


def matmul_peak(dtype: "torch.dtype | None" = None, size: int = 2048,
                seconds: float = 2.0) -> float:
    """FLOP/s of the fastest of repeated ``size`` x ``size`` products in ``dtype`` on the CPU,
    with torch's current thread count, over about ``seconds`` of products (after one warm-up
    product; float32 unless ``dtype``). A product counts 2 size^3 FLOPs."""
    import torch

    dtype = dtype or torch.float32
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(size, size, generator=generator).to(dtype)
    right = torch.randn(size, size, generator=generator).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.mm(left, right, out=out)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == float("inf"):
        start = time.perf_counter()
        torch.mm(left, right, out=out)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best
